//! The rules that turn what a server publishes and what speedtap sees
//! into each waiting call's [`Wait`] (`docs/metering.md`, "Why a call
//! waits"). Pure: the poller passes the server's latest state, the
//! route's normals and `now`.
//!
//! In order, the first that applies:
//! 1. `loading_model`: the call is a cold start and the server has not
//!    shown its load over. Cold: at the first look after dispatch the
//!    model was not among the server's loaded models (`/api/ps`), or it
//!    was but the reading before the dispatch did not list it and no other
//!    call for it ran since (it appeared for this call), or `/api/ps` has held its answer for over
//!    [`PS_HELD`] while the call waits. Over: `/api/ps` lists the model
//!    (a held answer comes once the load ended). ETA: this model's usual
//!    load time left, plus its usual warm
//!    TTFT.
//!
//!    Why these signs: since mid 2026 Ollama holds `/api/ps` for a whole
//!    load (`loadedModels` takes each runner's lock, which the load holds);
//!    before, it listed a model from the start of its load, so a model that
//!    appeared for the call marks it cold, though the reason then leaves
//!    `loading_model` as soon as the model is listed (a known gap).
//! 2. `queued`: the call has no slot and speedtap's own calls dispatched
//!    before it, still in flight on this upstream (a streaming call whose
//!    task has left `/slots` no longer counts: the server is done with it),
//!    with the later ones the server runs already (served first: their
//!    requests overtook this one's on the way),
//!    fill every slot the server has (the larger of `/props` `total_slots`
//!    and the `/slots` list), the latest `/slots` shows no free slot
//!    (however old: speedtap's own count is no evidence of a full server),
//!    and no reading taken after the call's dispatch contradicts it:
//!    `/metrics` showing room (nothing deferred and fewer requests
//!    processing than there are slots). Position: those calls ahead of it.
//!
//!    Or, on a server that publishes no slot count (Ollama): the server
//!    is learned serial for the call's model ([`super::serial`]: at least
//!    five pairs of its calls were in flight together and none streamed at
//!    the same time) and calls for that model are ahead of it. Without
//!    either piece of evidence a waiting call is never `queued`.
//!
//!    Why only readings taken after the dispatch, and why "deferred 0"
//!    alone is no contradiction: llama-server answers `/slots` and
//!    `/metrics` between two prompt batches, so a reading can be seconds
//!    old, and a call the server has not taken in yet (it is still busy
//!    with the batch) is not counted as deferred although it waits.
//! 3. `prefilling`: the server's slot for the call (`/slots`) shows its
//!    prompt progress: `n_prompt_tokens_processed` against the prompt
//!    size, the larger of the slot's `n_prompt_tokens` and the call's own
//!    (calibrated) prompt size. Older llama-servers put the whole prompt
//!    in `n_prompt_tokens`; newer ones only the tokens taken in so far
//!    (processed plus the batch under way), which alone would make a
//!    progress that is always one batch from done. The ETA is what is left
//!    at the rate the looks allow ([`super::prefill_rate`]: the learned
//!    rate within their bounds, else the bounds' middle once they are
//!    tight; none while they are wide). Without
//!    `/slots`, the progress is the time since the prefill started times
//!    this route and model's learned prefill rate, against the call's
//!    (calibrated) prompt size.
//! 4. `unknown`.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use super::prefill_rate::PrefillLooks;
use super::serial::SerialLearner;
use super::server::{same_model, LoadedModel, Props, Queue, SlotState};
use crate::meter::normals::Normals;
use crate::model::{Placement, ProgressSource, Wait, WaitReason};

/// An `/api/ps` answer this late was held by the server: a model loads.
pub const PS_HELD: Duration = Duration::from_secs(1);

/// `/api/ps` readings kept besides the latest (a few seconds of looks).
pub const PS_KEPT: usize = 8;

/// The server's latest published state; `None`: not published (or not yet
/// read).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServerView {
    /// Ollama's loaded models.
    pub ps: Option<Vec<LoadedModel>>,
    /// llama-server's slots.
    pub slots: Option<Vec<SlotState>>,
    /// llama-server's properties.
    pub props: Option<Props>,
    /// The queue gauges of `/metrics`.
    pub queue: Option<Queue>,
    /// When the look that read `ps` began: only a look begun after a
    /// call's dispatch may decide whether its model was loaded.
    pub ps_at: Option<Instant>,
    /// The readings before `ps` (the newest [`PS_KEPT`], oldest first),
    /// each with when its look began: a model one did not list and `ps`
    /// lists appeared in between. More than one, because a call's model
    /// may become known only after the look that followed its dispatch.
    pub ps_before: VecDeque<(Instant, Vec<LoadedModel>)>,
    /// Since when the `/api/ps` request under way has been held past
    /// [`PS_HELD`] (`None`: no request is held).
    pub ps_held_since: Option<Instant>,
    /// When the look that read `slots` began.
    pub slots_at: Option<Instant>,
    /// When the look that read `queue` began.
    pub queue_at: Option<Instant>,
}

impl ServerView {
    /// The server's slot count: `/props` `total_slots`, or the `/slots`
    /// list when it is longer (`/props` is read seldom, and a server may
    /// have added slots since).
    fn total_slots(&self) -> Option<u64> {
        let listed = self.slots.as_ref().map(|s| s.len() as u64);
        let declared = self.props.as_ref().and_then(|p| p.total_slots);
        declared.max(listed).filter(|n| *n > 0)
    }

    fn loaded(&self, model: &str) -> Option<&LoadedModel> {
        self.ps
            .as_ref()?
            .iter()
            .find(|m| same_model(model, &m.name))
    }

    /// Takes a new `/api/ps` reading from a look begun `at`.
    pub fn read_ps(&mut self, models: Vec<LoadedModel>, at: Instant) {
        if let (Some(prev), Some(prev_at)) = (self.ps.take(), self.ps_at) {
            if self.ps_before.len() == PS_KEPT {
                self.ps_before.pop_front();
            }
            self.ps_before.push_back((prev_at, prev));
        }
        self.ps = Some(models);
        self.ps_at = Some(at);
        self.ps_held_since = None;
    }

    /// `model` is listed now but was not in the reading taken before
    /// `since`: when that reading's look began. The model was loaded (or
    /// is loading) since then, for a call dispatched in between.
    fn appeared_since(&self, model: &str, since: Instant) -> Option<Instant> {
        self.loaded(model)?;
        let (at, before) = self.ps_before.iter().rev().find(|(at, _)| *at < since)?;
        (*at < since && !before.iter().any(|m| same_model(model, &m.name))).then_some(*at)
    }
}

/// The facts the server tells about a call's model, for its details.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerFacts {
    /// The loaded context size.
    pub context_size: Option<u64>,
    /// Where the model runs.
    pub placement: Option<Placement>,
    /// The loaded model's bytes.
    pub model_bytes: Option<u64>,
    /// Of those, in VRAM.
    pub vram_bytes: Option<u64>,
    /// The model was not loaded at dispatch (`Some(false)`: it was).
    pub cold: Option<bool>,
    /// The load itself was seen: the model appeared in `/api/ps` for this
    /// call, or `/api/ps` was held while it waited. A model merely not
    /// listed at dispatch (one that does not exist, a server that lists
    /// nothing) is no evidence of a load: such a call is never called
    /// cold for it (`docs/metering.md`, "Cold only with a load").
    pub load_seen: bool,
    /// The server's version, as the poller last read it (the same for
    /// every call on the route; set by the poller, not the rules).
    pub server_version: Option<String>,
}

/// One call speedtap sees on the route.
#[derive(Clone, Debug)]
struct Tracked {
    model: Option<String>,
    dispatched_at: Instant,
    /// The prompt size, calibrated (from the request body).
    prompt_tokens: Option<u64>,
    waiting: bool,
    cold: Option<bool>,
    /// The server's slot and task serving it.
    slot: Option<(u64, u64)>,
    /// The looks at that slot task's prefill: the rate they allow.
    progress: PrefillLooks,
    /// When the call stopped loading or queueing (its prefill began).
    prefill_since: Option<Instant>,
    /// Calls for the same model, in flight with this one, that streamed
    /// and ended while it waited: evidence of a serial server.
    waited_out: u32,
    facts: ServerFacts,
}

impl Tracked {
    /// A cold start whose model the server does not list yet (a listing
    /// from an answer the server held, or from a server that lists a model
    /// once loaded, says the load is over).
    fn loading(&self, view: &ServerView) -> bool {
        self.waiting
            && self.cold == Some(true)
            && self
                .model
                .as_deref()
                .is_none_or(|m| view.loaded(m).is_none())
    }

    /// Whether the server is done with this call although speedtap still
    /// tracks it: it streams (no longer waits) and the task matched to it
    /// has left the server's slots. The server has then handed its slot to
    /// the next call while the last bytes were still on their way, so the
    /// call takes no slot and holds no queue place: counting it ahead would
    /// keep the next call "queued" on a slot it already runs on, and leave
    /// that call's task unmatched for good.
    fn done_on_server(&self, view: &ServerView) -> bool {
        let (Some((slot_id, task)), Some(slots)) = (self.slot, &view.slots) else {
            return false;
        };
        !self.waiting
            && !slots
                .iter()
                .any(|s| s.id == slot_id && s.task == Some(task) && s.busy)
    }

    /// Decides cold or warm at the first look begun after the dispatch
    /// (`appeared`: the model appeared for this call), or cold when
    /// `/api/ps` is held while the call waits.
    fn judge_cold(&mut self, view: &ServerView, appeared: bool) {
        let fresh_look = view.ps_at.is_some_and(|at| at >= self.dispatched_at);
        if self.cold.is_none() && view.ps.is_some() && fresh_look {
            if let Some(model) = &self.model {
                self.cold = Some(view.loaded(model).is_none() || appeared);
                self.facts.load_seen |= appeared;
            }
        }
        // `/api/ps` held while the call waits: the server is loading,
        // and this call waits for that load, unless its own model was
        // listed at the last answer (another model loads beside it).
        let listed_before = self
            .model
            .as_deref()
            .is_some_and(|m| view.loaded(m).is_some());
        if self.cold.is_none() && self.waiting && view.ps_held_since.is_some() && !listed_before {
            self.cold = Some(true);
            self.facts.load_seen = true;
        }
    }

    /// Takes what `/api/ps` tells about the call's model into its facts.
    fn read_model_facts(&mut self, view: &ServerView) {
        if let Some(m) = self.model.as_deref().and_then(|m| view.loaded(m)) {
            // Not loaded at dispatch, listed now: it loaded for this call.
            self.facts.load_seen |= self.cold == Some(true);
            self.facts.model_bytes = m.size;
            self.facts.vram_bytes = m.size_vram;
            self.facts.placement = match (m.size, m.size_vram) {
                (Some(size), Some(vram)) if size > 0 => Some(Placement::from_sizes(size, vram)),
                _ => None,
            };
            self.facts.context_size = m.context_length.or(self.facts.context_size);
        }
        self.facts.cold = self.cold;
    }

    /// A task matched to a waiting call that the slots no longer run
    /// was not that call's: the server took a later call's request
    /// in first (two requests racing through its HTTP threads), ran
    /// it and let it go while this call still waits. The match is
    /// undone, with its progress samples, so the call's own task is
    /// matched when it shows.
    fn unmatch_task_gone(&mut self, view: &ServerView) {
        if let (true, Some((slot_id, task)), Some(slots)) = (self.waiting, self.slot, &view.slots) {
            let running = slots
                .iter()
                .any(|s| s.id == slot_id && s.task == Some(task) && s.busy);
            if !running {
                self.slot = None;
                self.progress = PrefillLooks::default();
            }
        }
    }

    /// Whether the call takes the next task nobody took: it waits with no
    /// task, its model is not loading, and the calls `ahead` of it leave
    /// one of the server's `total_slots` free.
    fn takes_fresh_task(&self, view: &ServerView, total_slots: Option<u64>, ahead: u64) -> bool {
        if !self.waiting || self.slot.is_some() {
            return false;
        }
        let loading = self.loading(view);
        let queued_by_count = total_slots.is_some_and(|n| ahead >= n);
        !loading && !queued_by_count
    }

    /// Samples the prefill progress of the slot task matched to the call,
    /// and takes the slot's context size.
    fn follow_slot(&mut self, view: &ServerView, now: Instant) {
        let Some((slot_id, task)) = self.slot else {
            return;
        };
        let Some(s) = view
            .slots
            .iter()
            .flatten()
            .find(|s| s.id == slot_id && s.task == Some(task))
        else {
            return;
        };
        self.facts.context_size = s.n_ctx.or(self.facts.context_size);
        if let (Some(done), Some(taken_in)) = (s.prompt_processed, s.prompt_tokens) {
            self.progress.record(now, done, taken_in);
        }
    }

    /// Why the call waits at `look`, with `ahead` calls taking a slot or
    /// a queue place before it (`sign`: other evidence of a queue, on a
    /// server that publishes no slots): the rules of the module doc, in
    /// order.
    fn wait(&mut self, look: &Look<'_>, ahead: u64, sign: QueueSign) -> Wait {
        let model = self.model.clone().unwrap_or_default();
        let warm_usual = look
            .normals
            .usual_ttft_ms(look.route, &model, self.prompt_tokens, false);
        // 1. Loading.
        if self.loading(look.view) {
            return self.loading_wait(look, &model, warm_usual);
        }
        // 2. Queued, by the server's slots, its waiting count or a
        // learned serial server.
        let position = match sign {
            _ if self.queued(look, ahead) => Some(Some(ahead)),
            _ if self.slot.is_some() => None,
            QueueSign::Serial(n) if n > 0 => Some(Some(n)),
            QueueSign::Gauge => Some(None),
            _ => None,
        };
        if let Some(position) = position {
            return Wait {
                position: position.map(|p| p as u32),
                prompt_tokens: self.prompt_tokens,
                ..Wait::new(WaitReason::Queued)
            };
        }
        let since = *self.prefill_since.get_or_insert(look.now);
        let learned_rate = look
            .normals
            .get(look.route, &model)
            .and_then(|n| n.prefill_tokens_per_ms());
        // 3a. Prefilling, from the server's slot.
        if let Some(wait) = self.prefill_from_slot(look, &model, learned_rate) {
            return wait;
        }
        // 3b. Prefilling, estimated from the learned rate.
        if let Some(wait) = self.prefill_estimated(look.now, since, learned_rate, warm_usual) {
            return wait;
        }
        // 4. Unknown.
        Wait {
            usual_ms: warm_usual,
            prompt_tokens: self.prompt_tokens,
            ..Wait::new(WaitReason::Unknown)
        }
    }

    /// Rule 1: the wait of a call whose model loads; the ETA is the usual
    /// load time left plus the usual warm TTFT.
    fn loading_wait(&self, look: &Look<'_>, model: &str, warm_usual: Option<u64>) -> Wait {
        let elapsed = look
            .now
            .saturating_duration_since(self.dispatched_at)
            .as_millis() as u64;
        let usual = look.normals.usual_load_ms(look.route, model);
        let eta = usual.map(|u| u.saturating_sub(elapsed) + warm_usual.unwrap_or(0));
        Wait {
            eta_ms: eta,
            usual_ms: usual,
            prompt_tokens: self.prompt_tokens,
            ..Wait::new(WaitReason::LoadingModel)
        }
    }

    /// Rule 2: the call has no slot, the calls `ahead` of it fill every
    /// slot, the latest `/slots` shows none free, and no gauge reading
    /// taken after its dispatch shows room.
    fn queued(&self, look: &Look<'_>, ahead: u64) -> bool {
        let read_since_dispatch = |at: Option<Instant>| at.is_some_and(|t| t >= self.dispatched_at);
        // A free slot in the latest `/slots`, however old, is no evidence
        // of a full server: the count of calls ahead alone is speedtap's
        // inference, not the server's queue (a burst's count can outrun a
        // slot list read before it).
        let contradicted =
            look.free_slot || (look.gauges_show_room && read_since_dispatch(look.view.queue_at));
        self.slot.is_none() && look.total_slots.is_some_and(|n| ahead >= n) && !contradicted
    }

    /// Rule 3, from the server's slot: the progress its task shows, while
    /// it still takes the prompt in.
    fn prefill_from_slot(
        &self,
        look: &Look<'_>,
        model: &str,
        learned_rate: Option<f64>,
    ) -> Option<Wait> {
        let (id, task) = self.slot?;
        let s = look
            .view
            .slots
            .iter()
            .flatten()
            .find(|s| s.id == id && s.task == Some(task))?;
        let (Some(taken_in), Some(done)) = (s.prompt_tokens, s.prompt_processed) else {
            return None;
        };
        let total = taken_in.max(self.prompt_tokens.unwrap_or(0));
        if total == 0 || done >= total || s.decoded.unwrap_or(0) != 0 {
            return None;
        }
        // Tokens per ms as far as the looks tell, and the time left at
        // that pace from where they say the prompt stands.
        let rate = self.progress.rate(total, learned_rate);
        let eta = rate.and_then(|r| self.progress.eta_ms(total, r, look.now));
        // The server's own total, or the call's calibrated estimate when
        // that is larger (newer servers count only what was taken in).
        let source = if total == taken_in {
            ProgressSource::Server
        } else {
            ProgressSource::Estimate
        };
        Some(Wait {
            progress: Some(round3(done as f64 / total as f64)),
            progress_source: Some(source),
            eta_ms: eta,
            usual_ms: look
                .normals
                .usual_ttft_ms(look.route, model, Some(total), false),
            prompt_tokens: Some(total),
            ..Wait::new(WaitReason::Prefilling)
        })
    }

    /// Rule 3 without a slot: the time in prefill (`since`) at the learned
    /// rate, against the call's prompt size.
    fn prefill_estimated(
        &self,
        now: Instant,
        since: Instant,
        learned_rate: Option<f64>,
        warm_usual: Option<u64>,
    ) -> Option<Wait> {
        let (Some(prompt), Some(rate)) = (self.prompt_tokens, learned_rate) else {
            return None;
        };
        if prompt == 0 {
            return None;
        }
        let in_prefill = now.saturating_duration_since(since).as_millis() as f64;
        let progress = (in_prefill * rate / prompt as f64).min(0.99);
        let total_ms = prompt as f64 / rate;
        Some(Wait {
            progress: Some(round3(progress)),
            progress_source: Some(ProgressSource::Estimate),
            eta_ms: Some((total_ms - in_prefill).max(0.0).round() as u64),
            usual_ms: warm_usual,
            prompt_tokens: Some(prompt),
            ..Wait::new(WaitReason::Prefilling)
        })
    }
}

/// Evidence, beside the server's slots, that a call waits in a queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum QueueSign {
    /// Nothing says so.
    None,
    /// A learned serial server, with this many calls for the model ahead.
    Serial(u64),
    /// The server's own waiting count, which names no place.
    Gauge,
}

/// One look at a route, as [`Tracker::explain`] reads it for each waiting
/// call.
struct Look<'a> {
    route: &'a str,
    view: &'a ServerView,
    normals: &'a Normals,
    now: Instant,
    total_slots: Option<u64>,
    /// `/slots` shows a slot free.
    free_slot: bool,
    /// The server's gauges show a slot free: nothing waits, and fewer
    /// requests run than it has slots.
    gauges_show_room: bool,
}

impl<'a> Look<'a> {
    fn new(route: &'a str, view: &'a ServerView, normals: &'a Normals, now: Instant) -> Self {
        let total_slots = view.total_slots();
        let free_slot = view
            .slots
            .as_ref()
            .map(|s| s.iter().any(|s| !s.busy))
            .unwrap_or(false);
        let gauges_show_room = view.queue.as_ref().is_some_and(|q| {
            q.deferred == Some(0)
                && q.processing
                    .zip(total_slots)
                    .is_some_and(|(running, slots)| running < slots)
        });
        Look {
            route,
            view,
            normals,
            now,
            total_slots,
            free_slot,
            gauges_show_room,
        }
    }
}

/// Every call in flight on one route, in dispatch order (by sequence
/// number), and what is known of each.
#[derive(Debug, Default)]
pub struct Tracker {
    calls: BTreeMap<u64, Tracked>,
    /// When the last call for each model ended: a model that appeared in
    /// `/api/ps` while another call for it was in flight was that call's
    /// load, not the next one's.
    ended: HashMap<String, Instant>,
    /// Server tasks already matched (or running before speedtap looked).
    seen_tasks: HashSet<(u64, u64)>,
    /// Whether the server runs each model one call at a time.
    serial: SerialLearner,
}

impl Tracker {
    /// A call was dispatched.
    pub fn track(&mut self, seq: u64, model: Option<String>, dispatched_at: Instant) {
        self.calls.insert(
            seq,
            Tracked {
                model,
                dispatched_at,
                prompt_tokens: None,
                waiting: true,
                cold: None,
                slot: None,
                progress: PrefillLooks::default(),
                prefill_since: None,
                waited_out: 0,
                facts: ServerFacts::default(),
            },
        );
    }

    /// The request named its model or its prompt size became known.
    pub fn update(&mut self, seq: u64, model: Option<String>, prompt_tokens: Option<u64>) {
        if let Some(c) = self.calls.get_mut(&seq) {
            if model.is_some() {
                c.model = model;
            }
            if prompt_tokens.is_some() {
                c.prompt_tokens = prompt_tokens;
            }
        }
    }

    /// Whether the call is tracked without a model yet.
    pub fn model_unknown(&self, seq: u64) -> bool {
        self.calls.get(&seq).is_some_and(|c| c.model.is_none())
    }

    /// The call's first token arrived: it no longer waits.
    ///
    /// A call that gets its first token with no task matched to it while
    /// an earlier call still waits on a matched one was served first: the
    /// two requests reached the server in the other order (each opens its
    /// own upstream connection, and the later connection can win). Tasks
    /// are matched in dispatch order, so the earlier call's task was this
    /// one's: it moves here, and the earlier call waits again unmatched
    /// (queued behind this one) until its own task shows.
    ///
    /// Only when every slot of the server (in `view`) is held by a matched
    /// call: with a slot to spare, the call may have had one of its own,
    /// come and gone between two looks, and the other calls' matches
    /// stand.
    pub fn first_token(&mut self, seq: u64, view: &ServerView) {
        let unmatched = self
            .calls
            .get(&seq)
            .is_some_and(|c| c.waiting && c.slot.is_none());
        let held = self
            .calls
            .values()
            .filter(|c| c.slot.is_some() && !c.done_on_server(view))
            .count() as u64;
        let no_slot_to_spare = view.total_slots().is_some_and(|n| held >= n);
        let taken_from = (unmatched && no_slot_to_spare)
            .then(|| {
                self.calls
                    .iter()
                    .find(|(s, c)| **s != seq && c.waiting && c.slot.is_some())
                    .map(|(s, _)| *s)
            })
            .flatten();
        let handed = taken_from.and_then(|other| {
            let c = self.calls.get_mut(&other)?;
            let handed = (c.slot.take(), std::mem::take(&mut c.progress));
            c.prefill_since = None;
            Some(handed)
        });
        self.learn_serial(seq);
        if let Some(c) = self.calls.get_mut(&seq) {
            c.waiting = false;
            if let Some((slot, progress)) = handed {
                c.slot = slot;
                c.progress = progress;
            }
        }
    }

    /// Call `seq`'s first token: evidence for or against a serial server.
    /// Another call for its model streaming now proves the server runs
    /// calls side by side; else each call it was in flight with that
    /// streamed and ended before it is a serial pair.
    fn learn_serial(&mut self, seq: u64) {
        let Some(c) = self.calls.get(&seq).filter(|c| c.waiting) else {
            return;
        };
        let Some(model) = c.model.clone() else {
            return;
        };
        let together = self
            .calls
            .iter()
            .any(|(s, o)| *s != seq && !o.waiting && o.model.as_deref() == Some(&*model));
        if together {
            self.serial.streamed_together(&model);
        } else {
            self.serial.streamed_after(&model, c.waited_out);
        }
    }

    /// The call ended at `now`. A call that streamed and ended is, for
    /// every call for its model still waiting, one call it waited out.
    pub fn untrack(&mut self, seq: u64, now: Instant) {
        let Some(gone) = self.calls.remove(&seq) else {
            return;
        };
        let Some(model) = gone.model else {
            return;
        };
        if !gone.waiting {
            for c in self.calls.values_mut() {
                if c.waiting && c.model.as_deref() == Some(&*model) {
                    c.waited_out = c.waited_out.saturating_add(1);
                }
            }
        }
        self.ended.insert(model, now);
    }

    /// For each call in dispatch order, when the server publishes no slot
    /// count and runs its model one call at a time: the calls for that
    /// model ahead of it (dispatched before it and still in flight, or
    /// after it and streaming already).
    fn serial_ahead(&self, view: &ServerView) -> Vec<Option<u64>> {
        let calls: Vec<&Tracked> = self.calls.values().collect();
        calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let model = c.model.as_deref()?;
                if view.total_slots().is_some() || !self.serial.is_serial(model) {
                    return None;
                }
                let same = |o: &&&Tracked| o.model.as_deref() == Some(model);
                let before = calls[..i].iter().filter(same).count();
                let later = calls[i + 1..]
                    .iter()
                    .filter(same)
                    .filter(|o| !o.waiting)
                    .count();
                Some((before + later) as u64)
            })
            .collect()
    }

    /// For each call in dispatch order, the evidence of a queue besides
    /// the slots: a learned serial server, or, on a server that publishes
    /// no slot count, its own waiting count (`/metrics`: vLLM's
    /// `num_requests_waiting`, llama-server's `requests_deferred`) read
    /// after the dispatch: the latest that many calls still waiting and
    /// dispatched before the reading wait in it (it names no place).
    fn queue_signs(&self, view: &ServerView) -> Vec<QueueSign> {
        let mut signs: Vec<QueueSign> = self
            .serial_ahead(view)
            .into_iter()
            .map(|n| n.map_or(QueueSign::None, QueueSign::Serial))
            .collect();
        let waiting = view
            .queue
            .as_ref()
            .and_then(|q| q.deferred)
            .zip(view.queue_at)
            .filter(|(n, _)| *n > 0 && view.total_slots().is_none());
        if let Some((mut left, at)) = waiting {
            for (i, c) in self.calls.values().enumerate().rev() {
                if left == 0 {
                    break;
                }
                if c.waiting && c.slot.is_none() && c.dispatched_at <= at {
                    if signs[i] == QueueSign::None {
                        signs[i] = QueueSign::Gauge;
                    }
                    left -= 1;
                }
            }
        }
        signs
    }

    /// Whether a call for `model` other than `seq` was in flight after
    /// `since` (one tracked now and dispatched before `seq`, or one that
    /// ended after `since`).
    fn other_call_for(&self, model: &str, seq: u64, since: Instant) -> bool {
        self.ended.get(model).is_some_and(|t| *t > since)
            || self
                .calls
                .range(..seq)
                .any(|(_, c)| c.model.as_deref() == Some(model))
    }

    /// For each call in dispatch order, how many calls dispatched after it
    /// the server is already serving (a matched task it still runs): a
    /// later call served first holds a slot ahead of it all the same.
    fn served_later(&self, view: &ServerView) -> Vec<u64> {
        let mut counts = vec![0; self.calls.len()];
        let mut later = 0;
        for (i, c) in self.calls.values().enumerate().rev() {
            counts[i] = later;
            if c.slot.is_some() && !c.done_on_server(view) {
                later += 1;
            }
        }
        counts
    }

    /// Calls in flight.
    pub fn len(&self) -> usize {
        self.calls.len()
    }

    /// No call in flight.
    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// Some call still awaits its first token.
    pub fn any_waiting(&self) -> bool {
        self.calls.values().any(|c| c.waiting)
    }

    /// Each call still awaiting its first token, with its dispatch time.
    pub fn waiting_since(&self) -> Vec<(u64, Instant)> {
        self.calls
            .iter()
            .filter(|(_, c)| c.waiting)
            .map(|(seq, c)| (*seq, c.dispatched_at))
            .collect()
    }

    /// Takes a fresh server state into account: decides cold or warm for
    /// calls that have not had a look yet, matches new slot tasks to
    /// waiting calls in dispatch order, and gathers each call's facts.
    pub fn observe(&mut self, view: &ServerView, now: Instant) {
        let mut fresh = self.fresh_tasks(view).into_iter();
        let total_slots = view.total_slots();
        let seqs: Vec<u64> = self.calls.keys().copied().collect();
        let served_later = self.served_later(view);
        // Calls before this one that still take a slot or a queue place.
        let mut before: u64 = 0;
        for (i, seq) in seqs.into_iter().enumerate() {
            // ... and later ones the server already serves.
            let ahead = before + served_later[i];
            let appeared = self.appeared_for(seq, view);
            let Some(c) = self.calls.get_mut(&seq) else {
                continue;
            };
            c.judge_cold(view, appeared);
            c.read_model_facts(view);
            c.unmatch_task_gone(view);
            if c.takes_fresh_task(view, total_slots, ahead) {
                if let Some(s) = fresh.next() {
                    if let Some(task) = s.task {
                        c.slot = Some((s.id, task));
                        self.seen_tasks.insert((s.id, task));
                    }
                }
            }
            c.follow_slot(view, now);
            if c.facts.context_size.is_none() {
                c.facts.context_size = view.props.as_ref().and_then(|p| p.n_ctx);
            }
            if !c.done_on_server(view) {
                before += 1;
            }
        }
        // Tasks nobody took (other clients, or calls speedtap saw end) are
        // not matched later either.
        for s in fresh {
            if let Some(task) = s.task {
                self.seen_tasks.insert((s.id, task));
            }
        }
        self.forget_gone_tasks(view);
    }

    /// Tasks on busy slots not yet matched, oldest task first.
    fn fresh_tasks<'v>(&self, view: &'v ServerView) -> Vec<&'v SlotState> {
        let mut fresh: Vec<&SlotState> = view
            .slots
            .iter()
            .flatten()
            .filter(|s| s.busy && s.task.is_some())
            .filter(|s| !self.seen_tasks.contains(&(s.id, s.task.unwrap_or(0))))
            .collect();
        fresh.sort_by_key(|s| s.task);
        fresh
    }

    /// Whether the model of call `seq`, at its first look, appeared for it:
    /// absent from the reading before its dispatch, listed now, and no
    /// other call for the model was in flight in between to have loaded
    /// it.
    fn appeared_for(&self, seq: u64, view: &ServerView) -> bool {
        self.calls.get(&seq).is_some_and(|c| {
            c.cold.is_none()
                && c.model.as_deref().is_some_and(|m| {
                    view.appeared_since(m, c.dispatched_at)
                        .is_some_and(|before| !self.other_call_for(m, seq, before))
                })
        })
    }

    /// A task gone from the slots never comes back (task ids only grow):
    /// only those still shown need remembering, so the set stays as
    /// small as the server's slot list however long the route runs.
    fn forget_gone_tasks(&mut self, view: &ServerView) {
        if let Some(slots) = &view.slots {
            self.seen_tasks.retain(|seen| {
                slots
                    .iter()
                    .any(|s| (s.id, s.task) == (seen.0, Some(seen.1)))
            });
        }
    }

    /// The facts gathered for a call.
    pub fn facts(&self, seq: u64) -> Option<&ServerFacts> {
        self.calls.get(&seq).map(|c| &c.facts)
    }

    /// The wait of every call still awaiting its first token, by sequence
    /// number.
    pub fn explain(
        &mut self,
        route: &str,
        view: &ServerView,
        normals: &Normals,
        now: Instant,
    ) -> Vec<(u64, Wait)> {
        let look = Look::new(route, view, normals, now);
        let mut out = Vec::new();
        let seqs: Vec<u64> = self.calls.keys().copied().collect();
        let served_later = self.served_later(view);
        let signs = self.queue_signs(view);
        // Calls before this one that still take a slot or a queue place,
        // and later ones the server already serves (as in `observe`).
        let mut before: u64 = 0;
        for (i, seq) in seqs.into_iter().enumerate() {
            let Some(c) = self.calls.get_mut(&seq) else {
                continue;
            };
            let ahead = before + served_later[i];
            if !c.done_on_server(view) {
                before += 1;
            }
            if !c.waiting {
                continue;
            }
            out.push((seq, c.wait(&look, ahead, signs[i])));
        }
        out
    }
}

fn round3(x: f64) -> f64 {
    (x.clamp(0.0, 1.0) * 1000.0).floor() / 1000.0
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn ms(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    fn slot(id: u64, busy: bool, task: Option<u64>, total: u64, done: u64) -> SlotState {
        SlotState {
            id,
            busy,
            task,
            n_ctx: Some(4096),
            prompt_tokens: Some(total),
            prompt_processed: Some(done),
            decoded: Some(0),
        }
    }

    fn listed(name: &str) -> LoadedModel {
        LoadedModel {
            name: name.into(),
            size: Some(100),
            size_vram: Some(50),
            context_length: Some(2048),
            expires_at_ms: None,
        }
    }

    #[test]
    fn a_model_missing_at_dispatch_loads_until_a_held_api_ps_answer_lists_it() {
        // Ollama since mid 2026: the first look beats the load to the
        // scheduler (nothing listed), the next is held until the load ends.
        let t0 = Instant::now();
        let mut t = Tracker::default();
        let normals = Normals::new();
        t.track(1, Some("m".into()), t0);
        let mut view = ServerView::default();
        view.read_ps(vec![], t0);
        t.observe(&view, t0);
        let w = t.explain("r", &view, &normals, ms(t0, 500));
        assert_eq!(w[0].1.reason, WaitReason::LoadingModel);
        assert_eq!(t.facts(1).unwrap().cold, Some(true));
        view.ps_held_since = Some(ms(t0, 500));
        t.observe(&view, ms(t0, 1_500));
        let w = t.explain("r", &view, &normals, ms(t0, 1_500));
        assert_eq!(w[0].1.reason, WaitReason::LoadingModel);
        // The held answer comes once the model is up.
        view.read_ps(vec![listed("m:latest")], ms(t0, 500));
        t.observe(&view, ms(t0, 4_000));
        let w = t.explain("r", &view, &normals, ms(t0, 4_000));
        assert_eq!(w[0].1.reason, WaitReason::Unknown);
        let facts = t.facts(1).unwrap();
        assert_eq!(facts.placement, Some(Placement::Split));
        assert_eq!(facts.context_size, Some(2048));
        assert_eq!(facts.cold, Some(true), "cold stays cold");
    }

    #[test]
    fn a_held_api_ps_while_a_call_waits_is_a_load_under_way() {
        let t0 = Instant::now();
        let mut t = Tracker::default();
        let normals = Normals::new();
        t.track(1, Some("m".into()), t0);
        // The first look after the dispatch is the held one: no reading.
        let view = ServerView {
            ps_held_since: Some(t0),
            ..ServerView::default()
        };
        t.observe(&view, ms(t0, 1_000));
        let w = t.explain("r", &view, &normals, ms(t0, 1_000));
        assert_eq!(w[0].1.reason, WaitReason::LoadingModel);
        assert_eq!(t.facts(1).unwrap().cold, Some(true));
    }

    #[test]
    fn a_model_that_appeared_while_an_earlier_call_for_it_ran_is_a_warm_start() {
        // The reading before this call was taken while an earlier call was
        // loading the model: it appeared for that call, not this one.
        let t0 = Instant::now();
        let mut t = Tracker::default();
        let normals = Normals::new();
        let mut view = ServerView::default();
        t.track(1, Some("m".into()), ms(t0, 0));
        view.read_ps(vec![], ms(t0, 1));
        t.observe(&view, ms(t0, 2));
        t.first_token(1, &view);
        t.untrack(1, ms(t0, 400));
        t.track(2, Some("m".into()), ms(t0, 1_000));
        view.read_ps(vec![listed("m")], ms(t0, 1_000));
        t.observe(&view, ms(t0, 1_010));
        let w = t.explain("r", &view, &normals, ms(t0, 1_100));
        assert_eq!(w[0].1.reason, WaitReason::Unknown, "{w:?}");
        assert_eq!(t.facts(2).unwrap().cold, Some(false));
    }

    #[test]
    fn a_model_named_after_two_looks_still_counts_the_reading_before_its_dispatch() {
        let t0 = Instant::now();
        let mut t = Tracker::default();
        let mut view = ServerView::default();
        view.read_ps(vec![], ms(t0, 0));
        t.track(1, None, ms(t0, 100));
        view.read_ps(vec![listed("m")], ms(t0, 100));
        t.observe(&view, ms(t0, 110));
        view.read_ps(vec![listed("m")], ms(t0, 600));
        t.observe(&view, ms(t0, 610));
        // The request's model is read only now.
        t.update(1, Some("m".into()), None);
        t.observe(&view, ms(t0, 620));
        // It appeared for this call: a cold start.
        assert_eq!(t.facts(1).unwrap().cold, Some(true));
    }

    #[test]
    fn a_model_listed_before_and_after_the_dispatch_is_a_warm_start() {
        let t0 = Instant::now();
        let mut t = Tracker::default();
        let normals = Normals::new();
        let mut view = ServerView::default();
        view.read_ps(vec![listed("m")], ms(t0, 0));
        t.track(1, Some("m".into()), ms(t0, 100));
        view.read_ps(vec![listed("m")], ms(t0, 100));
        t.observe(&view, ms(t0, 110));
        let w = t.explain("r", &view, &normals, ms(t0, 600));
        assert_eq!(w[0].1.reason, WaitReason::Unknown);
        assert_eq!(t.facts(1).unwrap().cold, Some(false));
    }

    #[test]
    fn with_one_slot_the_second_call_is_queued_behind_the_first_then_prefills() {
        let t0 = Instant::now();
        let mut t = Tracker::default();
        let normals = Normals::new();
        t.track(1, Some("m".into()), t0);
        t.track(2, Some("m".into()), ms(t0, 10));
        let mut view = ServerView {
            slots: Some(vec![slot(0, true, Some(5), 1000, 100)]),
            ..ServerView::default()
        };
        t.observe(&view, ms(t0, 100));
        let w = t.explain("r", &view, &normals, ms(t0, 100));
        assert_eq!(w[0].1.reason, WaitReason::Prefilling);
        assert_eq!(w[0].1.progress, Some(0.1));
        assert_eq!(w[0].1.progress_source, Some(ProgressSource::Server));
        assert_eq!(w[1].1.reason, WaitReason::Queued);
        assert_eq!(w[1].1.position, Some(1));
        // The first call streams, then ends; the second gets the slot.
        t.first_token(1, &view);
        t.untrack(1, ms(t0, 900));
        view.slots = Some(vec![slot(0, true, Some(6), 4000, 0)]);
        t.observe(&view, ms(t0, 950));
        for (at, done) in [(1000, 500), (1500, 1000), (2000, 1500), (2500, 2000)] {
            view.slots = Some(vec![slot(0, true, Some(6), 4000, done)]);
            t.observe(&view, ms(t0, at));
        }
        let w = t.explain("r", &view, &normals, ms(t0, 2500));
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].1.reason, WaitReason::Prefilling);
        assert_eq!(w[0].1.progress, Some(0.5));
        assert_eq!(w[0].1.prompt_tokens, Some(4000));
        // A batch of at most 500 (the smallest step) each look: the looks
        // allow 0.97 to 1.33 tokens a ms. At the middle, 1.15, they put
        // the prompt at 2,226 to 2,283 tokens: 1,746 left is 1.52 s.
        assert_eq!(w[0].1.eta_ms, Some(1_517));
        // Without a new look the ETA counts down from the latest.
        let w = t.explain("r", &view, &normals, ms(t0, 3000));
        assert_eq!(w[0].1.eta_ms, Some(1_017));
    }

    #[test]
    fn a_streaming_call_whose_task_left_the_slot_no_longer_keeps_the_next_one_queued() {
        // The server ends the first call's task and starts the second's
        // while the first call's last bytes are still on their way: speedtap
        // still tracks the first call when it looks.
        let t0 = Instant::now();
        let normals = Normals::new();
        let mut t = Tracker::default();
        t.track(1, Some("m".into()), t0);
        t.track(2, Some("m".into()), ms(t0, 10));
        t.update(2, None, Some(2_000));
        let mut view = ServerView {
            slots: Some(vec![slot(0, true, Some(5), 1_000, 100)]),
            ..ServerView::default()
        };
        t.observe(&view, ms(t0, 100));
        let w = t.explain("r", &view, &normals, ms(t0, 100));
        assert_eq!(w[1].1.reason, WaitReason::Queued);
        t.first_token(1, &view);
        // Task 5 is gone, task 6 (the second call's) prefills; call 1 is
        // still tracked.
        view.slots = Some(vec![slot(0, true, Some(6), 2_000, 500)]);
        t.observe(&view, ms(t0, 1_000));
        let w = t.explain("r", &view, &normals, ms(t0, 1_000));
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].0, 2);
        assert_eq!(w[0].1.reason, WaitReason::Prefilling, "{w:?}");
        assert_eq!(w[0].1.progress, Some(0.25));
        // And it stays matched once the first call is untracked.
        t.untrack(1, ms(t0, 1_200));
        view.slots = Some(vec![slot(0, true, Some(6), 2_000, 1_000)]);
        t.observe(&view, ms(t0, 1_500));
        let w = t.explain("r", &view, &normals, ms(t0, 1_500));
        assert_eq!(w[0].1.progress, Some(0.5));
    }

    #[test]
    fn a_streaming_call_still_on_its_slot_keeps_the_next_one_queued() {
        let t0 = Instant::now();
        let normals = Normals::new();
        let mut t = Tracker::default();
        t.track(1, Some("m".into()), t0);
        t.track(2, Some("m".into()), ms(t0, 10));
        let view = ServerView {
            slots: Some(vec![slot(0, true, Some(5), 1_000, 1_000)]),
            ..ServerView::default()
        };
        t.observe(&view, ms(t0, 100));
        t.first_token(1, &view);
        t.observe(&view, ms(t0, 600));
        let w = t.explain("r", &view, &normals, ms(t0, 600));
        assert_eq!(w[0].1.reason, WaitReason::Queued, "{w:?}");
        assert_eq!(w[0].1.position, Some(1));
    }

    #[test]
    fn a_task_that_ends_while_its_call_still_waits_was_another_calls_and_is_let_go() {
        // Two requests race through the server's HTTP threads and the later,
        // shorter one reaches the slot first: it is matched to the call
        // dispatched first, runs, and ends while that call still waits.
        let t0 = Instant::now();
        let normals = Normals::new();
        let mut t = Tracker::default();
        t.track(1, Some("m".into()), t0);
        t.update(1, None, Some(1_888));
        t.track(2, Some("m".into()), ms(t0, 10));
        t.update(2, None, Some(27));
        let mut view = ServerView {
            slots: Some(vec![slot(0, true, Some(5), 27, 0)]),
            ..ServerView::default()
        };
        t.observe(&view, ms(t0, 100));
        t.first_token(2, &view);
        t.untrack(2, ms(t0, 1_000));
        // Now the first call's own task runs in the slot.
        view.slots = Some(vec![slot(0, true, Some(6), 256, 0)]);
        t.observe(&view, ms(t0, 1_050));
        view.slots = Some(vec![slot(0, true, Some(6), 512, 256)]);
        t.observe(&view, ms(t0, 1_100));
        let w = t.explain("r", &view, &normals, ms(t0, 1_100));
        assert_eq!(w[0].1.reason, WaitReason::Prefilling, "{w:?}");
        assert_eq!(w[0].1.progress, Some(0.135), "{w:?}");
        assert_eq!(w[0].1.prompt_tokens, Some(1_888));
        // Its progress is measured from its own task's samples only.
        view.slots = Some(vec![slot(0, true, Some(6), 768, 512)]);
        t.observe(&view, ms(t0, 2_100));
        let w = t.explain("r", &view, &normals, ms(t0, 2_100));
        assert_eq!(w[0].1.progress, Some(0.271));
        for (at, done) in [(3_100, 768), (4_100, 1_024)] {
            view.slots = Some(vec![slot(0, true, Some(6), done + 256, done)]);
            t.observe(&view, ms(t0, at));
        }
        let w = t.explain("r", &view, &normals, ms(t0, 4_100));
        // Its own task's looks allow 0.25 to 0.34 tokens a ms (the other
        // task's 27 tokens at 100 ms would have allowed less), and at the
        // middle the prompt stands at about 1,153: 735 left is 2.5 s.
        assert_eq!(w[0].1.eta_ms, Some(2_478));
        // Only the tasks the slots still show are remembered.
        assert_eq!(t.seen_tasks.len(), 1);
    }

    #[test]
    fn a_later_call_served_first_takes_the_task_matched_to_the_earlier_one() {
        // Two calls with the same prompt, dispatched 1 ms apart: the later
        // one's upstream connection wins and the server runs it first, so
        // the one task on the slot is matched to the earlier call until the
        // later one's first token shows whose it was.
        let t0 = Instant::now();
        let normals = Normals::new();
        let mut t = Tracker::default();
        t.track(1, Some("m".into()), t0);
        t.track(2, Some("m".into()), ms(t0, 1));
        let mut view = ServerView {
            slots: Some(vec![slot(0, true, Some(5), 4_000, 3_000)]),
            ..ServerView::default()
        };
        t.observe(&view, ms(t0, 100));
        let w = t.explain("r", &view, &normals, ms(t0, 100));
        assert_eq!(w[0].1.reason, WaitReason::Prefilling);
        assert_eq!(w[1].1.reason, WaitReason::Queued);
        t.first_token(2, &view);
        // Call 2 streams on task 5: call 1 is queued behind it.
        view.slots = Some(vec![SlotState {
            decoded: Some(3),
            ..slot(0, true, Some(5), 4_000, 4_000)
        }]);
        t.observe(&view, ms(t0, 600));
        let w = t.explain("r", &view, &normals, ms(t0, 600));
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].0, 1);
        assert_eq!(w[0].1.reason, WaitReason::Queued, "{w:?}");
        assert_eq!(w[0].1.position, Some(1));
        // Then call 1's own task prefills, measured from its own samples.
        view.slots = Some(vec![slot(0, true, Some(6), 8_000, 0)]);
        t.observe(&view, ms(t0, 1_050));
        for (at, done) in [
            (1_100, 1_000),
            (1_600, 2_000),
            (2_100, 3_000),
            (2_600, 4_000),
        ] {
            view.slots = Some(vec![slot(0, true, Some(6), 8_000, done)]);
            t.observe(&view, ms(t0, at));
        }
        let w = t.explain("r", &view, &normals, ms(t0, 2_600));
        assert_eq!(w[0].1.reason, WaitReason::Prefilling, "{w:?}");
        assert_eq!(w[0].1.progress, Some(0.5));
        // Its own samples only (task 5's 3,000 at 100 ms are not among
        // them): 1.94 to 2.67 tokens a ms, and at the middle the prompt
        // stands at 4,452 to 4,567: 3,491 left is 1.52 s.
        assert_eq!(w[0].1.eta_ms, Some(1_517));
    }

    #[test]
    fn a_first_token_on_a_call_with_its_own_task_moves_no_match() {
        let t0 = Instant::now();
        let mut t = Tracker::default();
        t.track(1, Some("m".into()), t0);
        t.track(2, Some("m".into()), ms(t0, 1));
        let view = ServerView {
            slots: Some(vec![
                slot(0, true, Some(5), 100, 100),
                slot(1, true, Some(6), 100, 50),
            ]),
            ..ServerView::default()
        };
        t.observe(&view, ms(t0, 100));
        t.first_token(1, &view);
        assert_eq!(t.calls[&1].slot, Some((0, 5)));
        assert_eq!(t.calls[&2].slot, Some((1, 6)));
    }

    #[test]
    fn with_a_slot_to_spare_a_first_token_takes_no_other_calls_task() {
        // Two slots: call 2's own task may have come and gone between two
        // looks, so call 1 keeps the task it was matched to.
        let t0 = Instant::now();
        let mut t = Tracker::default();
        t.track(1, Some("m".into()), t0);
        t.track(2, Some("m".into()), ms(t0, 1));
        let view = ServerView {
            slots: Some(vec![
                slot(0, true, Some(5), 4_000, 1_000),
                slot(1, false, None, 0, 0),
            ]),
            ..ServerView::default()
        };
        t.observe(&view, ms(t0, 100));
        t.first_token(2, &view);
        assert_eq!(t.calls[&1].slot, Some((0, 5)));
        assert_eq!(t.calls[&2].slot, None);
    }

    /// A warm call whose server reported `tokens` of prefill in `ms`.
    fn long_prefill(tokens: u64, ms: u64) -> crate::meter::normals::Observation {
        crate::meter::normals::Observation {
            ttft_ms: ms,
            prompt_tokens: Some(tokens),
            prefill: Some((tokens, ms as f64)),
            ..Default::default()
        }
    }

    #[test]
    fn without_slots_the_prefill_is_estimated_from_the_learned_rate() {
        let t0 = Instant::now();
        let mut normals = Normals::new();
        for p in [1_000u64, 2_000, 4_000] {
            normals.observe(
                "r",
                "m",
                &crate::meter::normals::Observation {
                    ttft_ms: p,
                    prompt_tokens: Some(p),
                    ..Default::default()
                },
            );
        }
        let mut t = Tracker::default();
        t.track(1, Some("m".into()), t0);
        t.update(1, None, Some(4_000));
        let view = ServerView::default();
        t.observe(&view, t0);
        let _ = t.explain("r", &view, &normals, t0);
        let w = t.explain("r", &view, &normals, ms(t0, 1_000));
        assert_eq!(w[0].1.reason, WaitReason::Prefilling);
        assert_eq!(w[0].1.progress, Some(0.25));
        assert_eq!(w[0].1.progress_source, Some(ProgressSource::Estimate));
        assert_eq!(w[0].1.eta_ms, Some(3_000));
        assert_eq!(w[0].1.usual_ms, Some(4_000));
    }

    #[test]
    fn a_slot_progress_over_the_calls_own_estimate_is_labelled_an_estimate() {
        let t0 = Instant::now();
        let normals = Normals::new();
        let mut t = Tracker::default();
        t.track(1, Some("m".into()), t0);
        // The body's calibrated size is 3,000 tokens; the newer server
        // counts only the 512 taken in so far.
        t.update(1, None, Some(3_000));
        let mut view = ServerView {
            slots: Some(vec![slot(0, true, Some(5), 512, 256)]),
            ..ServerView::default()
        };
        t.observe(&view, ms(t0, 100));
        let w = t.explain("r", &view, &normals, ms(t0, 100));
        assert_eq!(w[0].1.prompt_tokens, Some(3_000));
        assert_eq!(w[0].1.progress_source, Some(ProgressSource::Estimate));
        // Once the server's own total is the larger, the figures are its.
        view.slots = Some(vec![slot(0, true, Some(5), 4_000, 1_000)]);
        t.observe(&view, ms(t0, 600));
        let w = t.explain("r", &view, &normals, ms(t0, 600));
        assert_eq!(w[0].1.prompt_tokens, Some(4_000));
        assert_eq!(w[0].1.progress, Some(0.25));
        assert_eq!(w[0].1.progress_source, Some(ProgressSource::Server));
    }

    /// Runs `pairs` rounds of two calls for `m` on a server without slots:
    /// the first streams and ends, then the second gets its first token.
    fn serve_in_turn(t: &mut Tracker, view: &ServerView, t0: Instant, pairs: u64) -> u64 {
        let mut seq = 100;
        for i in 0..pairs {
            let at = ms(t0, i * 1_000);
            t.track(seq, Some("m".into()), at);
            t.track(seq + 1, Some("m".into()), ms(at, 1));
            t.first_token(seq, view);
            t.untrack(seq, ms(at, 300));
            t.first_token(seq + 1, view);
            t.untrack(seq + 1, ms(at, 600));
            seq += 2;
        }
        seq
    }

    #[test]
    fn without_slots_a_second_call_is_queued_only_once_the_model_is_learned_serial() {
        let t0 = Instant::now();
        let normals = Normals::new();
        let view = ServerView::default();
        let mut t = Tracker::default();
        // Four pairs served in turn: not yet evidence.
        let seq = serve_in_turn(&mut t, &view, t0, 4);
        let now = ms(t0, 10_000);
        t.track(seq, Some("m".into()), now);
        t.first_token(seq, &view);
        t.track(seq + 1, Some("m".into()), ms(now, 10));
        let w = t.explain("r", &view, &normals, ms(now, 100));
        assert_eq!(w[0].1.reason, WaitReason::Unknown, "{w:?}");
        // The fifth pair: the second call waited the first out.
        t.untrack(seq, ms(now, 300));
        t.first_token(seq + 1, &view);
        t.untrack(seq + 1, ms(now, 600));
        let now = ms(t0, 20_000);
        t.track(1, Some("m".into()), now);
        t.first_token(1, &view);
        t.track(2, Some("m".into()), ms(now, 10));
        t.track(3, Some("m".into()), ms(now, 20));
        t.track(4, Some("other".into()), ms(now, 30));
        let w = t.explain("r", &view, &normals, ms(now, 100));
        assert_eq!(w[0].1.reason, WaitReason::Queued, "{w:?}");
        assert_eq!(w[0].1.position, Some(1));
        assert_eq!(w[1].1.position, Some(2));
        assert_eq!(
            w[2].1.reason,
            WaitReason::Unknown,
            "another model is not learned"
        );
    }

    #[test]
    fn without_slots_two_calls_streaming_together_prove_the_server_parallel() {
        let t0 = Instant::now();
        let normals = Normals::new();
        let view = ServerView::default();
        let mut t = Tracker::default();
        let seq = serve_in_turn(&mut t, &view, t0, 5);
        let now = ms(t0, 10_000);
        t.track(seq, Some("m".into()), now);
        t.track(seq + 1, Some("m".into()), ms(now, 1));
        t.first_token(seq, &view);
        t.first_token(seq + 1, &view);
        t.untrack(seq, ms(now, 300));
        t.untrack(seq + 1, ms(now, 300));
        t.track(1, Some("m".into()), ms(now, 1_000));
        t.first_token(1, &view);
        t.track(2, Some("m".into()), ms(now, 1_010));
        let w = t.explain("r", &view, &normals, ms(now, 1_100));
        assert_eq!(w[0].1.reason, WaitReason::Unknown, "{w:?}");
    }

    #[test]
    fn a_slot_list_read_before_a_burst_showing_free_slots_never_queues_it() {
        // Two slots, both idle at the last reading; four calls dispatched
        // since: the count says full, the server's own state does not.
        let t0 = Instant::now();
        let normals = Normals::new();
        let mut t = Tracker::default();
        let view = ServerView {
            slots: Some(vec![slot(0, false, None, 0, 0), slot(1, false, None, 0, 0)]),
            slots_at: Some(t0),
            ..ServerView::default()
        };
        for seq in 1..=4 {
            t.track(seq, Some("m".into()), ms(t0, 10 + seq));
        }
        let w = t.explain("r", &view, &normals, ms(t0, 20));
        assert!(
            w.iter().all(|(_, w)| w.reason != WaitReason::Queued),
            "{w:?}"
        );
    }

    #[test]
    fn a_slot_list_that_grew_past_the_declared_count_shows_room_and_takes_the_task() {
        // `/props` read at start said one slot; the server has added one.
        let t0 = Instant::now();
        let normals = Normals::new();
        let mut t = Tracker::default();
        t.track(1, Some("m".into()), t0);
        t.track(2, Some("m".into()), ms(t0, 10));
        let view = ServerView {
            props: Some(Props {
                n_ctx: None,
                total_slots: Some(1),
                build_info: None,
            }),
            slots: Some(vec![
                slot(0, true, Some(5), 100, 100),
                slot(1, false, None, 0, 0),
            ]),
            slots_at: Some(ms(t0, 10)),
            ..ServerView::default()
        };
        t.observe(&view, ms(t0, 20));
        let w = t.explain("r", &view, &normals, ms(t0, 20));
        assert_ne!(w[1].1.reason, WaitReason::Queued, "{w:?}");
        let view = ServerView {
            slots: Some(vec![
                slot(0, true, Some(5), 100, 100),
                slot(1, true, Some(6), 1_000, 500),
            ]),
            ..view
        };
        t.observe(&view, ms(t0, 500));
        let w = t.explain("r", &view, &normals, ms(t0, 500));
        assert_eq!(w[1].1.reason, WaitReason::Prefilling, "{w:?}");
        assert_eq!(w[1].1.progress, Some(0.5));
    }

    #[test]
    fn without_slots_the_servers_own_waiting_count_read_after_the_dispatch_queues_the_latest_calls()
    {
        // vLLM: no slots, `num_requests_waiting` and `_running` only.
        let t0 = Instant::now();
        let normals = Normals::new();
        let mut t = Tracker::default();
        t.track(1, Some("m".into()), t0);
        t.track(2, Some("m".into()), ms(t0, 10));
        t.track(3, Some("m".into()), ms(t0, 20));
        let mut view = ServerView {
            queue: gauges(1, 2),
            queue_at: Some(ms(t0, 15)),
            ..ServerView::default()
        };
        // Read before call 3 was sent: the one waiting is call 2.
        let w = t.explain("r", &view, &normals, ms(t0, 100));
        let reasons: Vec<WaitReason> = w.iter().map(|(_, w)| w.reason).collect();
        assert_eq!(
            reasons,
            [WaitReason::Unknown, WaitReason::Queued, WaitReason::Unknown]
        );
        assert_eq!(w[1].1.position, None, "the count names no place");
        // Nothing waiting: nobody is queued.
        view.queue = gauges(0, 3);
        view.queue_at = Some(ms(t0, 600));
        let w = t.explain("r", &view, &normals, ms(t0, 700));
        assert!(
            w.iter().all(|(_, w)| w.reason != WaitReason::Queued),
            "{w:?}"
        );
    }

    fn gauges(deferred: u64, processing: u64) -> Option<Queue> {
        Some(Queue {
            deferred: Some(deferred),
            processing: Some(processing),
        })
    }

    #[test]
    fn gauges_read_before_the_dispatch_or_not_yet_counting_the_call_leave_it_queued() {
        let t0 = Instant::now();
        let normals = Normals::new();
        let mut t = Tracker::default();
        t.track(1, Some("m".into()), t0);
        t.track(2, Some("m".into()), ms(t0, 100));
        // Read before the second call was sent: "nothing deferred" says
        // nothing about it.
        let mut view = ServerView {
            slots: Some(vec![slot(0, true, Some(5), 1000, 0)]),
            slots_at: Some(t0),
            queue: gauges(0, 0),
            queue_at: Some(t0),
            ..ServerView::default()
        };
        t.observe(&view, ms(t0, 600));
        let w = t.explain("r", &view, &normals, ms(t0, 600));
        assert_eq!(w[1].1.reason, WaitReason::Queued);
        assert_eq!(w[1].1.position, Some(1));
        // Read after it, with its one slot busy: the server has not taken
        // the call in yet (it is between batches), so it still waits.
        view.queue = gauges(0, 1);
        view.queue_at = Some(ms(t0, 500));
        t.observe(&view, ms(t0, 1_100));
        let w = t.explain("r", &view, &normals, ms(t0, 1_100));
        assert_eq!(w[1].1.reason, WaitReason::Queued);
        // Deferred, as the server counts it once it has taken the call in.
        view.queue = gauges(1, 1);
        let w = t.explain("r", &view, &normals, ms(t0, 1_600));
        assert_eq!(w[1].1.reason, WaitReason::Queued);
        // A fresh reading with room: the server is not making it wait.
        view.queue = gauges(0, 0);
        view.queue_at = Some(ms(t0, 1_600));
        let w = t.explain("r", &view, &normals, ms(t0, 2_100));
        assert_ne!(w[1].1.reason, WaitReason::Queued, "{w:?}");
        // Nor is it with a free slot seen after the dispatch (the server
        // says it has one slot, so the free one is not a second).
        view.queue = None;
        view.props = Some(Props {
            n_ctx: None,
            total_slots: Some(1),
            build_info: None,
        });
        view.slots = Some(vec![
            slot(0, true, Some(5), 1000, 0),
            slot(1, false, None, 0, 0),
        ]);
        view.slots_at = Some(ms(t0, 1_600));
        let w = t.explain("r", &view, &normals, ms(t0, 2_100));
        assert_ne!(w[1].1.reason, WaitReason::Queued, "{w:?}");
    }

    #[test]
    fn a_slot_counting_only_the_prompt_taken_in_so_far_is_measured_against_the_whole_prompt() {
        // Newer llama-servers report n_prompt_tokens as processed plus the
        // batch under way (256, 512, ...), not the whole prompt.
        let t0 = Instant::now();
        let normals = Normals::new();
        let mut t = Tracker::default();
        t.track(1, Some("m".into()), t0);
        t.update(1, None, Some(1_000));
        let mut view = ServerView {
            slots: Some(vec![slot(0, true, Some(7), 256, 0)]),
            ..ServerView::default()
        };
        t.observe(&view, ms(t0, 100));
        let w = t.explain("r", &view, &normals, ms(t0, 100));
        assert_eq!(w[0].1.reason, WaitReason::Prefilling);
        assert_eq!(w[0].1.progress, Some(0.0));
        assert_eq!(w[0].1.prompt_tokens, Some(1_000));
        view.slots = Some(vec![slot(0, true, Some(7), 512, 256)]);
        t.observe(&view, ms(t0, 1_100));
        let w = t.explain("r", &view, &normals, ms(t0, 1_100));
        assert_eq!(w[0].1.progress, Some(0.256));
        // One change of the count gives no rate: the batch may have begun
        // before the first look.
        assert_eq!(w[0].1.eta_ms, None);
        view.slots = Some(vec![slot(0, true, Some(7), 768, 512)]);
        t.observe(&view, ms(t0, 2_100));
        let w = t.explain("r", &view, &normals, ms(t0, 2_100));
        assert_eq!(w[0].1.progress, Some(0.512));
        // Three looks a second apart, one batch each: anything from 0.13
        // to 0.38 tokens a ms fits them (the batch under way may have
        // begun just after a look or just before), too wide for an ETA.
        assert_eq!(w[0].1.eta_ms, None);
        // With a rate learned from this route's earlier calls, inside
        // those bounds, the ETA is the tokens left at it: at 0.25 a ms the
        // looks put the prompt at 512 to 756, and 366 left is 1.46 s.
        let mut learned = Normals::new();
        learned.observe("r", "m", &long_prefill(1_000, 4_000));
        let w = t.explain("r", &view, &learned, ms(t0, 2_100));
        assert_eq!(w[0].1.eta_ms, Some(1_464));
        // A server that counts the whole prompt still wins when larger.
        view.slots = Some(vec![slot(0, true, Some(7), 2_000, 1_000)]);
        t.observe(&view, ms(t0, 3_100));
        let w = t.explain("r", &view, &normals, ms(t0, 3_100));
        assert_eq!(w[0].1.progress, Some(0.5));
        assert_eq!(w[0].1.prompt_tokens, Some(2_000));
    }

    #[test]
    fn a_first_look_that_caught_a_batch_under_way_gives_no_rate() {
        // Two looks 82 ms apart saw 0 then 256 tokens: that batch began
        // before the first look (it took about 1.6 s), so 256 / 82 ms
        // would be a rate 20 times too fast and an ETA of almost nothing.
        let t0 = Instant::now();
        let normals = Normals::new();
        let mut t = Tracker::default();
        t.track(1, Some("m".into()), t0);
        t.update(1, None, Some(2_000));
        let mut view = ServerView {
            slots: Some(vec![slot(0, true, Some(3), 256, 0)]),
            ..ServerView::default()
        };
        t.observe(&view, ms(t0, 10));
        view.slots = Some(vec![slot(0, true, Some(3), 512, 256)]);
        t.observe(&view, ms(t0, 92));
        let w = t.explain("r", &view, &normals, ms(t0, 92));
        assert_eq!(w[0].1.eta_ms, None, "{w:?}");
        // A second change still leaves 0.15 to 0.32 tokens a ms: no ETA
        // yet, where the first-to-latest count read 512 tokens in 1.68 s
        // and gave one (4.9 s) on a batch's head start.
        view.slots = Some(vec![slot(0, true, Some(3), 768, 512)]);
        t.observe(&view, ms(t0, 1_692));
        let w = t.explain("r", &view, &normals, ms(t0, 1_692));
        assert_eq!(w[0].1.eta_ms, None, "{w:?}");
        // Looks a second apart as the batches go on narrow it to a third
        // of the middle: 0.21 to 0.28 tokens a ms; from where that puts
        // the prompt, 3.4 s are left.
        for (at, done) in [(2_692, 768), (3_692, 1_024)] {
            view.slots = Some(vec![slot(0, true, Some(3), done + 256, done)]);
            t.observe(&view, ms(t0, at));
        }
        let w = t.explain("r", &view, &normals, ms(t0, 3_692));
        assert_eq!(w[0].1.eta_ms, Some(3_434), "{w:?}");
    }
}
