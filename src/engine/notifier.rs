//! `Notifier`: turns "this call is still waiting for its first token"
//! alarms into notifications, at most one per route per minute.
//!
//! Each call actor raises its own alarm once, when its wait crosses
//! `slow_ttft_ms` while it is still waiting; the notifier only throttles
//! and fans out: to the engine's subscribers (the headless view prints a
//! warning line) and to the hooks a host registers (the tray app shows a
//! desktop notification). "Pause notifications" silences the hooks only;
//! subscribers still see the event.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix::{Actor, Context, Handler, Recipient};
use tokio::time::Instant;

use super::messages::{Broadcast, FirstTokenLate, SetNotificationsPaused};
use crate::model::{EngineEvent, SlowFirstToken};

/// At most one slow-first-token notification per route in this period.
pub const NOTIFY_THROTTLE: Duration = Duration::from_secs(60);

/// A host's reaction to a slow first token (e.g. a desktop notification).
/// Called on the notifier's thread: keep it short, hand real work off.
pub type SlowFirstTokenHook = Arc<dyn Fn(&SlowFirstToken) + Send + Sync>;

pub struct Notifier {
    last_fired: HashMap<String, Instant>,
    paused: bool,
    hooks: Vec<SlowFirstTokenHook>,
    broadcast: Recipient<Broadcast>,
}

impl Notifier {
    pub fn new(broadcast: Recipient<Broadcast>, hooks: Vec<SlowFirstTokenHook>) -> Self {
        Notifier {
            last_fired: HashMap::new(),
            paused: false,
            hooks,
            broadcast,
        }
    }

    /// True when `route` may notify at `now`, and records that it did.
    fn take_slot(&mut self, route: &str, now: Instant) -> bool {
        match self.last_fired.get(route) {
            Some(last) if now.saturating_duration_since(*last) < NOTIFY_THROTTLE => false,
            _ => {
                self.last_fired.insert(route.to_owned(), now);
                true
            }
        }
    }
}

impl Actor for Notifier {
    type Context = Context<Self>;
}

impl Handler<FirstTokenLate> for Notifier {
    type Result = ();
    fn handle(&mut self, msg: FirstTokenLate, _: &mut Self::Context) {
        if !self.take_slot(&msg.0.call.route, Instant::now()) {
            return;
        }
        if !self.paused {
            for hook in &self.hooks {
                hook(&msg.0);
            }
        }
        self.broadcast
            .do_send(Broadcast(EngineEvent::SlowFirstToken(msg.0)));
    }
}

impl Handler<SetNotificationsPaused> for Notifier {
    type Result = ();
    fn handle(&mut self, msg: SetNotificationsPaused, _: &mut Self::Context) {
        self.paused = msg.0;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use actix::{Addr, Message};

    use super::*;
    use crate::engine::supervisor::tests::{identity, run_paused};

    /// Stands in for the supervisor: keeps every broadcast it receives.
    #[derive(Default)]
    struct Collector(Vec<EngineEvent>);

    impl Actor for Collector {
        type Context = Context<Self>;
    }

    impl Handler<Broadcast> for Collector {
        type Result = ();
        fn handle(&mut self, msg: Broadcast, _: &mut Self::Context) {
            self.0.push(msg.0);
        }
    }

    /// Everything broadcast so far, by route.
    #[derive(Message)]
    #[rtype(result = "Vec<String>")]
    struct Routes;

    impl Handler<Routes> for Collector {
        type Result = Vec<String>;
        fn handle(&mut self, _: Routes, _: &mut Self::Context) -> Vec<String> {
            self.0
                .iter()
                .map(|e| match e {
                    EngineEvent::SlowFirstToken(s) => s.call.route.clone(),
                    other => panic!("unexpected broadcast {other:?}"),
                })
                .collect()
        }
    }

    struct Setup {
        notifier: Addr<Notifier>,
        collector: Addr<Collector>,
        /// The routes the hook was called for, in order.
        hooked: Arc<Mutex<Vec<String>>>,
    }

    impl Setup {
        fn start() -> Self {
            let collector = Collector::default().start();
            let hooked = Arc::new(Mutex::new(Vec::new()));
            let seen = hooked.clone();
            let hook: SlowFirstTokenHook =
                Arc::new(move |s: &SlowFirstToken| seen.lock().unwrap().push(s.call.route.clone()));
            let notifier = Notifier::new(collector.clone().recipient(), vec![hook]).start();
            Setup {
                notifier,
                collector,
                hooked,
            }
        }

        /// Raises an alarm for `route` now and waits until it was handled.
        async fn alarm(&self, route: &str) {
            self.notifier
                .send(FirstTokenLate(SlowFirstToken {
                    call: identity(1, route),
                    waited_ms: 5_000,
                    threshold_ms: 5_000,
                    reason: None,
                    usual_ms: None,
                }))
                .await
                .expect("notifier");
        }

        fn hooked(&self) -> Vec<String> {
            self.hooked.lock().unwrap().clone()
        }

        /// The notifier forwards with `do_send`, which was queued before
        /// this request: the answer includes every forwarded alarm.
        async fn broadcast(&self) -> Vec<String> {
            self.collector.send(Routes).await.expect("collector")
        }
    }

    /// The throttle needs only `Instant::now()` to move: no timers involved.
    async fn advance(ms: u64) {
        tokio::time::advance(Duration::from_millis(ms)).await;
    }

    #[test]
    fn one_notification_per_route_per_minute_counted_from_the_last_one_sent() {
        run_paused(async {
            let n = Setup::start();
            n.alarm("a").await;
            assert_eq!(n.hooked(), ["a"]);

            advance(30_000).await;
            n.alarm("a").await;
            assert_eq!(n.hooked(), ["a"]);

            // A throttled alarm doesn't extend the minute: it counts from
            // the one that was sent.
            advance(29_999).await;
            n.alarm("a").await;
            assert_eq!(n.hooked(), ["a"]);
            assert_eq!(n.broadcast().await, ["a"]);

            advance(1).await;
            n.alarm("a").await;
            assert_eq!(n.hooked(), ["a", "a"]);
            assert_eq!(n.broadcast().await, ["a", "a"]);
        });
    }

    #[test]
    fn routes_are_throttled_independently() {
        run_paused(async {
            let n = Setup::start();
            n.alarm("a").await;
            advance(1_000).await;
            n.alarm("b").await;
            assert_eq!(n.hooked(), ["a", "b"]);

            advance(29_000).await;
            n.alarm("a").await;
            n.alarm("b").await;
            assert_eq!(n.hooked(), ["a", "b"]);

            // 60 s after a's notification, 59 s after b's.
            advance(30_000).await;
            n.alarm("b").await;
            n.alarm("a").await;
            assert_eq!(n.hooked(), ["a", "b", "a"]);
            advance(1_000).await;
            n.alarm("b").await;
            assert_eq!(n.hooked(), ["a", "b", "a", "b"]);
            assert_eq!(n.broadcast().await, ["a", "b", "a", "b"]);
        });
    }

    #[test]
    fn pausing_silences_the_hooks_but_subscribers_still_hear_the_alarm() {
        run_paused(async {
            let n = Setup::start();
            n.notifier.send(SetNotificationsPaused(true)).await.unwrap();
            n.alarm("a").await;
            assert!(n.hooked().is_empty());
            assert_eq!(n.broadcast().await, ["a"]);

            n.notifier
                .send(SetNotificationsPaused(false))
                .await
                .unwrap();
            n.alarm("b").await;
            assert_eq!(n.hooked(), ["b"]);
            assert_eq!(n.broadcast().await, ["a", "b"]);
        });
    }
}
