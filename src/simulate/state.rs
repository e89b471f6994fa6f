//! What the simulated server holds between requests: which models are
//! loaded (Ollama's residency), which slots are busy and who waits for one
//! (llama-server's slots and deferred queue), and the running counters of
//! llama-server's `/metrics`.
//!
//! Why here and not in the request handler: the telemetry endpoints
//! (`/api/ps`, `/slots`, `/props`, `/metrics`) must show the same facts the
//! generation path acts on, at any instant. Everything is computed from
//! tokio instants passed in (never read from a timer), so on a paused test
//! clock a model expires, a slot frees and a prefill progresses exactly on
//! schedule: expiry is evaluated lazily whenever the state is looked at,
//! so no background task is needed.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::SimConfig;

/// The shared state of one running simulator.
#[derive(Debug)]
pub(crate) struct State {
    inner: Mutex<Inner>,
    /// One permit per slot when slots are limited (tokio's semaphore is
    /// FIFO, as llama-server's deferred queue is); `None` is unlimited.
    permits: Option<Arc<Semaphore>>,
    /// A tokio instant and the wall-clock time at that instant, so times
    /// shown in payloads (`expires_at`) follow the tokio clock (paused in
    /// tests) instead of drifting from it.
    epoch: (Instant, SystemTime),
    /// The model size and VRAM share a load uses unless the call says.
    model_size: u64,
    /// Whether a model still loading is listed.
    list_loading: bool,
}

#[derive(Debug, Default)]
struct Inner {
    models: Vec<Model>,
    slots: Vec<Slot>,
    /// Calls waiting for a slot now (`llamacpp:requests_deferred`).
    deferred: u64,
    next_task: u64,
    counters: Counters,
}

/// One model known to the server: loading, loaded, or loaded and idle.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Model {
    pub name: String,
    pub size: u64,
    pub size_vram: u64,
    /// When the load finishes (or finished).
    pub ready_at: Instant,
    /// Calls using the model now; it never unloads while one does.
    pub users: u32,
    /// When the last call using it ended.
    pub released_at: Option<Instant>,
    /// The session duration set by the latest call (`None`: forever).
    pub keep_alive: Option<Duration>,
}

impl Model {
    /// When the model unloads: `None` while in use or kept forever. Ollama
    /// starts the keep-alive timer when the last call ends (server/sched.go,
    /// `expiresAt = time.Now().Add(sessionDuration)`), never during a load.
    pub(crate) fn expires_at(&self) -> Option<Instant> {
        if self.users > 0 {
            return None;
        }
        let idle_since = self.released_at.unwrap_or(self.ready_at);
        Some(idle_since.max(self.ready_at) + self.keep_alive?)
    }

    pub(crate) fn loaded(&self, now: Instant) -> bool {
        now >= self.ready_at
    }
}

/// One generation slot (llama-server's `server_slot`).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Slot {
    pub id: u32,
    pub busy: bool,
    /// The current task, or the previous one on an idle slot (llama-server
    /// shows `task_prev` on idle slots).
    pub task: Option<Task>,
}

/// What a slot is doing, as timestamps the telemetry interpolates.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Task {
    pub id: u64,
    /// Prompt tokens the slot processes (after any cut).
    pub n_prompt: u64,
    /// When the slot started the prompt.
    pub start: Instant,
    /// When the prompt is fully processed.
    pub prefill_end: Instant,
    /// When the first output token is due.
    pub first: Instant,
    /// Output rate, for the running `n_decoded`.
    pub tokens_per_second: f64,
    /// Output tokens this task writes.
    pub n_output: u64,
    pub stream: bool,
    pub speculative: bool,
}

impl Task {
    /// Prompt tokens processed at `now`: rises linearly from `start` to
    /// `prefill_end` (llama-server advances it one batch at a time; linear
    /// is the limit of small batches).
    pub(crate) fn processed(&self, now: Instant) -> u64 {
        if now >= self.prefill_end {
            return self.n_prompt;
        }
        let total = self.prefill_end.duration_since(self.start).as_secs_f64();
        let done = now.saturating_duration_since(self.start).as_secs_f64();
        if total <= 0.0 {
            return self.n_prompt;
        }
        ((self.n_prompt as f64 * done / total).floor() as u64).min(self.n_prompt)
    }

    /// Output tokens written by `now` (token `i` is due at `first + i/tps`).
    pub(crate) fn decoded(&self, now: Instant) -> u64 {
        if now < self.first {
            return 0;
        }
        let since = now.duration_since(self.first).as_secs_f64();
        let n = (since * self.tokens_per_second + 1e-9).floor() as u64 + 1;
        n.min(self.n_output)
    }
}

/// llama-server's cumulative `/metrics` counters (server-task.cpp
/// `server_task_result_metrics::to_metrics`), recorded when a call ends.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Counters {
    pub prompt_tokens: u64,
    pub prompt_seconds: f64,
    pub predicted_tokens: u64,
    pub predicted_seconds: f64,
    pub n_decode: u64,
    pub n_tokens_max: u64,
    pub draft_tokens: u64,
    pub draft_accepted: u64,
    pub drafts: u64,
}

/// One finished call, for the counters.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Finished {
    pub prompt_tokens: u64,
    pub prompt_seconds: f64,
    pub output_tokens: u64,
    pub output_seconds: f64,
    pub drafts: Option<(u64, u64)>,
}

/// A snapshot for the telemetry endpoints.
#[derive(Clone, Debug)]
pub(crate) struct Snapshot {
    pub now: Instant,
    /// Loaded models, longest remaining time first (Ollama's order).
    pub models: Vec<Model>,
    pub slots: Vec<Slot>,
    pub deferred: u64,
    pub counters: Counters,
}

impl Snapshot {
    /// Busy slots (`llamacpp:requests_processing`).
    pub(crate) fn processing(&self) -> u64 {
        self.slots.iter().filter(|s| s.busy).count() as u64
    }
}

impl State {
    pub(crate) fn new(config: &SimConfig) -> State {
        let slots = match config.slots {
            Some(n) => (0..n)
                .map(|id| Slot {
                    id,
                    busy: false,
                    task: None,
                })
                .collect(),
            None => Vec::new(),
        };
        State {
            inner: Mutex::new(Inner {
                slots,
                ..Inner::default()
            }),
            permits: config.slots.map(|n| Arc::new(Semaphore::new(n as usize))),
            epoch: (Instant::now(), SystemTime::now()),
            model_size: config.model_size,
            list_loading: config.ps_while_loading == super::PsWhileLoading::Listed,
        }
    }

    /// When the last load under way at `now` ends; `None`: none is.
    pub(crate) fn loads_end(&self, now: Instant) -> Option<Instant> {
        self.lock()
            .models
            .iter()
            .map(|m| m.ready_at)
            .filter(|ready| *ready > now)
            .max()
    }

    /// From now on every resident model has `vram_fraction` of its size
    /// in VRAM (the rest on the CPU), as after a reload beside another
    /// model.
    pub(crate) fn set_vram_fraction(&self, vram_fraction: f64) {
        for m in self.lock().models.iter_mut() {
            m.size_vram = (m.size as f64 * vram_fraction).round() as u64;
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data behind; keep
        // serving rather than poison every later request.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The wall-clock time of a tokio instant.
    pub(crate) fn wall(&self, at: Instant) -> SystemTime {
        let (i0, w0) = self.epoch;
        if at >= i0 {
            w0 + at.duration_since(i0)
        } else {
            w0 - i0.duration_since(at)
        }
    }

    /// Starts using `name`: loads it when it is not resident (taking
    /// `load_time`), or joins a load in progress. Returns the guard that
    /// keeps it loaded while the call runs and when it is ready.
    pub(crate) fn use_model(
        self: &Arc<Self>,
        name: &str,
        load_time: Duration,
        keep_alive: Option<Duration>,
        vram_fraction: f64,
        now: Instant,
    ) -> (ModelUse, Instant) {
        let mut inner = self.lock();
        expire(&mut inner, now);
        let index = match inner.models.iter().position(|m| m.name == name) {
            Some(i) => i,
            None => {
                let size = self.model_size;
                inner.models.push(Model {
                    name: name.to_owned(),
                    size,
                    size_vram: (size as f64 * vram_fraction).round() as u64,
                    ready_at: now + load_time,
                    users: 0,
                    released_at: None,
                    keep_alive,
                });
                inner.models.len() - 1
            }
        };
        let model = &mut inner.models[index];
        model.users += 1;
        model.keep_alive = keep_alive;
        let ready_at = model.ready_at;
        let guard = ModelUse {
            state: self.clone(),
            name: name.to_owned(),
        };
        (guard, ready_at)
    }

    /// Waits for a free slot (FIFO) and takes the lowest free one.
    pub(crate) async fn acquire_slot(self: &Arc<Self>) -> SlotLease {
        let permit = match &self.permits {
            None => None,
            Some(sem) => match sem.clone().try_acquire_owned() {
                Ok(p) => Some(p),
                Err(_) => {
                    let waiting = Deferred::enter(self.clone());
                    let p = sem.clone().acquire_owned().await.ok();
                    drop(waiting);
                    p
                }
            },
        };
        let mut inner = self.lock();
        let id = match inner.slots.iter().position(|s| !s.busy) {
            Some(i) => i,
            None => {
                let id = inner.slots.len() as u32;
                inner.slots.push(Slot {
                    id,
                    busy: false,
                    task: None,
                });
                inner.slots.len() - 1
            }
        };
        inner.slots[id].busy = true;
        SlotLease {
            state: self.clone(),
            index: id,
            permit,
        }
    }

    /// A fresh task id (llama-server's `id_task`).
    pub(crate) fn next_task_id(&self) -> u64 {
        let mut inner = self.lock();
        let id = inner.next_task;
        inner.next_task += 1;
        id
    }

    /// Adds a finished call to the counters.
    pub(crate) fn record(&self, f: &Finished) {
        let mut inner = self.lock();
        let c = &mut inner.counters;
        c.prompt_tokens += f.prompt_tokens;
        c.prompt_seconds += f.prompt_seconds;
        c.predicted_tokens += f.output_tokens;
        c.predicted_seconds += f.output_seconds;
        c.n_decode += f.output_tokens + u64::from(f.prompt_tokens > 0);
        c.n_tokens_max = c.n_tokens_max.max(f.prompt_tokens + f.output_tokens);
        if let Some((drafted, accepted)) = f.drafts {
            c.draft_tokens += drafted;
            c.draft_accepted += accepted;
            c.drafts += f.output_tokens.saturating_sub(accepted);
        }
    }

    /// Everything the telemetry endpoints show, at `now`.
    pub(crate) fn snapshot(&self, now: Instant) -> Snapshot {
        let mut inner = self.lock();
        expire(&mut inner, now);
        let mut models: Vec<Model> = inner
            .models
            .iter()
            .filter(|m| self.list_loading || m.loaded(now))
            .cloned()
            .collect();
        // Ollama's PsHandler: longest remaining time first; a model in use
        // (or kept forever) counts as expiring last.
        models.sort_by_key(|m| std::cmp::Reverse(m.expires_at().unwrap_or(now + FOREVER)));
        Snapshot {
            now,
            models,
            slots: inner.slots.clone(),
            deferred: inner.deferred,
            counters: inner.counters.clone(),
        }
    }
}

/// How far away "never" is for ordering and display: a century.
pub(crate) const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Drops the models whose keep-alive ran out by `now`.
fn expire(inner: &mut Inner, now: Instant) {
    inner
        .models
        .retain(|m| m.expires_at().is_none_or(|at| at > now));
}

/// Keeps a model loaded while a call uses it; on drop the call is over
/// and the model's keep-alive starts.
#[derive(Debug)]
pub(crate) struct ModelUse {
    state: Arc<State>,
    name: String,
}

impl Drop for ModelUse {
    fn drop(&mut self) {
        let now = Instant::now();
        let mut inner = self.state.lock();
        if let Some(m) = inner.models.iter_mut().find(|m| m.name == self.name) {
            m.users = m.users.saturating_sub(1);
            m.released_at = Some(now);
        }
    }
}

/// Counts a call in `requests_deferred` while it waits for a slot, also
/// when the client gives up waiting (the future is dropped).
struct Deferred(Arc<State>);

impl Deferred {
    fn enter(state: Arc<State>) -> Deferred {
        state.lock().deferred += 1;
        Deferred(state)
    }
}

impl Drop for Deferred {
    fn drop(&mut self) {
        let mut inner = self.0.lock();
        inner.deferred = inner.deferred.saturating_sub(1);
    }
}

/// A busy slot; dropping it frees the slot (and then its permit, so the
/// next waiter finds the slot already idle).
#[derive(Debug)]
pub(crate) struct SlotLease {
    state: Arc<State>,
    index: usize,
    permit: Option<OwnedSemaphorePermit>,
}

impl SlotLease {
    /// Shows `task` on the slot.
    pub(crate) fn begin(&self, task: Task) {
        let mut inner = self.state.lock();
        if let Some(slot) = inner.slots.get_mut(self.index) {
            slot.task = Some(task);
        }
    }
}

impl Drop for SlotLease {
    fn drop(&mut self) {
        {
            let mut inner = self.state.lock();
            if let Some(slot) = inner.slots.get_mut(self.index) {
                slot.busy = false;
            }
        }
        drop(self.permit.take());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(config: SimConfig) -> Arc<State> {
        Arc::new(State::new(&config))
    }

    #[tokio::test(start_paused = true)]
    async fn an_ollama_that_lists_loading_models_shows_one_from_the_start_of_its_load() {
        let s = state(SimConfig {
            ps_while_loading: crate::simulate::PsWhileLoading::Listed,
            ..SimConfig::default()
        });
        let t0 = Instant::now();
        assert_eq!(s.loads_end(t0), None);
        let (_use, ready) = s.use_model("m", Duration::from_secs(3), None, 1.0, t0);
        assert_eq!(s.snapshot(t0).models.len(), 1, "listed while loading");
        // What a blocking /api/ps waits for.
        assert_eq!(s.loads_end(t0), Some(ready));
        assert_eq!(s.loads_end(ready), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_model_loads_after_its_load_time_and_expires_after_keep_alive() {
        let s = state(SimConfig::default());
        let t0 = Instant::now();
        let (use1, ready) = s.use_model(
            "m",
            Duration::from_secs(3),
            Some(Duration::from_secs(10)),
            0.5,
            t0,
        );
        assert_eq!(ready, t0 + Duration::from_secs(3));
        assert!(s.snapshot(t0).models.is_empty(), "not listed while loading");
        tokio::time::sleep(Duration::from_secs(5)).await;
        let snap = s.snapshot(Instant::now());
        assert_eq!(snap.models.len(), 1);
        assert_eq!(snap.models[0].size_vram, s.model_size / 2);
        drop(use1);
        let released = Instant::now();
        assert!(!s
            .snapshot(released + Duration::from_millis(9_999))
            .models
            .is_empty());
        assert!(s
            .snapshot(released + Duration::from_secs(10))
            .models
            .is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_second_call_joins_a_load_in_progress() {
        let s = state(SimConfig::default());
        let t0 = Instant::now();
        let (_a, ready_a) = s.use_model("m", Duration::from_secs(3), None, 1.0, t0);
        let t1 = t0 + Duration::from_secs(1);
        let (_b, ready_b) = s.use_model("m", Duration::from_secs(3), None, 1.0, t1);
        assert_eq!(ready_a, ready_b);
    }

    #[test]
    fn prefill_progress_is_linear_and_decoding_counts_due_tokens() {
        let t0 = Instant::now();
        let task = Task {
            id: 0,
            n_prompt: 1000,
            start: t0,
            prefill_end: t0 + Duration::from_secs(10),
            first: t0 + Duration::from_secs(10),
            tokens_per_second: 10.0,
            n_output: 5,
            stream: true,
            speculative: false,
        };
        assert_eq!(task.processed(t0), 0);
        assert_eq!(task.processed(t0 + Duration::from_secs(4)), 400);
        assert_eq!(task.processed(t0 + Duration::from_secs(11)), 1000);
        assert_eq!(task.decoded(t0 + Duration::from_secs(9)), 0);
        assert_eq!(task.decoded(t0 + Duration::from_secs(10)), 1);
        assert_eq!(task.decoded(t0 + Duration::from_millis(10_200)), 3);
        assert_eq!(task.decoded(t0 + Duration::from_secs(60)), 5);
    }
}
