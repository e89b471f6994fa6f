//! The per-call meter (`docs/metering.md` "One call"): one per metered call.
//!
//! It is fed the decoded events of one response, each with the time it
//! arrived, and answers with the snapshots to publish. It never reads a clock
//! and does no I/O: the glue passes `tokio::time::Instant`s in, so tests walk
//! virtual time exactly.
//!
//! # Rules (`docs/metering.md` "One call", and the choices made where it is silent)
//! - The clock starts at dispatch; [`CallMeter::start`] publishes the first
//!   snapshot (`awaiting_first_token`, elapsed 0). `elapsed_ms` is always
//!   now minus dispatch.
//! - TTFT = first non-empty output of any channel minus dispatch. Empty text
//!   is nothing: it neither starts TTFT nor changes the phase. A
//!   non-streamed response's TTFT is the time to its body.
//! - The phase is the channel of the *latest* output: text → `responding`,
//!   reasoning → `reasoning`, tool-call arguments → `calling_tool`. So text
//!   after a tool call reads `responding` again, and a tool call after text
//!   reads `calling_tool`: the phase says what the model is doing now.
//! - A phase change publishes at once; otherwise snapshots are at least
//!   `SNAPSHOT_INTERVAL` apart. Text is buffered and tokenized only when a
//!   snapshot is due (a phase change is one; the old channel's text is
//!   tokenized apart from the new channel's, since they are separate texts).
//!   The raw estimate accumulates; the published count is
//!   `round(raw × calibration)`.
//! - After each flush (tokenize + publish) the pair (now, tokens so far) goes
//!   onto the [`RateWindow`]; the live rate is read from it (streamed calls
//!   only: a non-streamed body arrives in one piece and has no live rate).
//! - Exact numbers live: once a streamed call's server reports a
//!   running generated-token count (llama.cpp `timings_per_token`), live
//!   snapshots publish that count with source `server`, and the rate window
//!   restarts on it, so a delta never mixes estimated and server counts.
//! - Settling and abandoning: see [`CallMeter::settle`] and
//!   [`CallMeter::abandon`]. After either, the meter is closed: further
//!   events are ignored and `latest()` stays the final snapshot.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::calibration::plausible_drift;
use super::limits::{MIN_FINAL_RATE_TOKENS, SNAPSHOT_INTERVAL};
use super::rate::{is_timed, RateWindow};
use crate::decode::event::{OutputChannel, ServerTimings, Usage};
use crate::model::snapshot::{round_rate, Phase, Snapshot, TokenSource};
use crate::tokens::TokenEstimator;

/// What settling a call produced.
#[derive(Clone, Debug, PartialEq)]
pub struct Settlement {
    /// The final snapshot (phase `complete`, `is_final`), to record with the
    /// call.
    pub snapshot: Snapshot,
    /// exact / raw estimate when it was a plausible tokenizer drift: feed it
    /// to [`super::calibration::CalibrationTable::observe`] for this call's
    /// (route, model). `None`: nothing to learn.
    pub calibration_ratio: Option<f64>,
    /// Prompt tokens, when the server reported them: the usage receipt's
    /// input tokens, else the server timings' evaluated plus cached prompt
    /// tokens (llama.cpp `prompt_n + cache_n`, which is what its Ollama-style
    /// `prompt_eval_count` reports).
    pub input_tokens: Option<u64>,
}

/// The per-call meter. See the module docs for the rules.
pub struct CallMeter {
    dispatched_at: Instant,
    streamed: bool,
    /// The route's factor for this (route, model) at dispatch.
    calibration: f64,
    estimator: Arc<dyn TokenEstimator>,
    phase: Phase,
    /// Output text not tokenized yet. Never logged (see the `Debug` impl).
    pending: String,
    /// Tokenizer count of all flushed text, before calibration.
    raw_estimate: u64,
    first_output_at: Option<Instant>,
    last_output_at: Option<Instant>,
    response_body_at: Option<Instant>,
    last_published_at: Option<Instant>,
    window: RateWindow,
    usage: Usage,
    timings: ServerTimings,
    /// The live count is the server's running count.
    live_from_server: bool,
    latest: Snapshot,
    /// Settled or abandoned: the meter is closed.
    ended: bool,
}

impl fmt::Debug for CallMeter {
    /// Everything but the buffered text (only its length): completion text is
    /// never logged.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallMeter")
            .field("dispatched_at", &self.dispatched_at)
            .field("streamed", &self.streamed)
            .field("calibration", &self.calibration)
            .field("phase", &self.phase)
            .field("pending_bytes", &self.pending.len())
            .field("raw_estimate", &self.raw_estimate)
            .field("first_output_at", &self.first_output_at)
            .field("last_output_at", &self.last_output_at)
            .field("response_body_at", &self.response_body_at)
            .field("usage", &self.usage)
            .field("timings", &self.timings)
            .field("live_from_server", &self.live_from_server)
            .field("latest", &self.latest)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl CallMeter {
    /// `streamed`: false for a non-streamed (JSON) response. `calibration`:
    /// the route's factor for this (route, model) at dispatch; a factor that
    /// is not a positive number is taken as 1.0 (uncalibrated) rather than
    /// zeroing or negating every count.
    pub fn new(
        dispatched_at: Instant,
        streamed: bool,
        calibration: f64,
        estimator: Arc<dyn TokenEstimator>,
    ) -> Self {
        let calibration = if calibration.is_finite() && calibration > 0.0 {
            calibration
        } else {
            1.0
        };
        Self {
            dispatched_at,
            streamed,
            calibration,
            estimator,
            phase: Phase::AwaitingFirstToken,
            pending: String::new(),
            raw_estimate: 0,
            first_output_at: None,
            last_output_at: None,
            response_body_at: None,
            last_published_at: None,
            window: RateWindow::new(),
            usage: Usage::default(),
            timings: ServerTimings::default(),
            live_from_server: false,
            latest: Snapshot {
                stalled_ms: None,
                phase: Phase::AwaitingFirstToken,
                is_final: false,
                elapsed_ms: 0,
                time_to_first_token_ms: None,
                output_tokens: 0,
                output_tokens_per_second: None,
                token_source: TokenSource::Estimated,
                wait: None,
            },
            ended: false,
        }
    }

    /// The first snapshot (awaiting_first_token, elapsed 0), published at
    /// once. Its time counts as the last publication for the spacing rule.
    pub fn start(&mut self) -> Snapshot {
        if self.ended {
            return self.latest.clone();
        }
        self.last_published_at = Some(self.dispatched_at);
        self.latest = self.live_snapshot(self.dispatched_at);
        self.latest.clone()
    }

    /// Non-empty output text on a channel, arriving at `now`. Returns a
    /// snapshot when one is due: at once on a phase change, otherwise when
    /// `SNAPSHOT_INTERVAL` has passed since the last published one. Text is
    /// buffered and only tokenized when a snapshot is due.
    ///
    /// Empty text is ignored entirely (no TTFT, no phase change).
    pub fn on_output(
        &mut self,
        channel: OutputChannel,
        text: &str,
        now: Instant,
    ) -> Option<Snapshot> {
        if self.ended || text.is_empty() {
            return None;
        }
        self.first_output_at.get_or_insert(now);
        self.last_output_at = Some(now);
        let phase = phase_of(channel);
        if phase != self.phase {
            // A channel boundary is a token boundary: the old channel's text
            // is tokenized on its own, never glued to the new channel's.
            self.tokenize_pending();
            self.pending.push_str(text);
            self.phase = phase;
            return Some(self.publish(now));
        }
        self.pending.push_str(text);
        self.interval_passed(now).then(|| self.publish(now))
    }

    /// A usage receipt (later ones win field by field).
    pub fn on_usage(&mut self, usage: &Usage) {
        if self.ended {
            return;
        }
        let u = &mut self.usage;
        u.output_tokens = usage.output_tokens.or(u.output_tokens);
        u.input_tokens = usage.input_tokens.or(u.input_tokens);
        u.reasoning_tokens = usage.reasoning_tokens.or(u.reasoning_tokens);
        u.cached_input_tokens = usage.cached_input_tokens.or(u.cached_input_tokens);
    }

    /// Server timings (later ones win field by field).
    ///
    /// Exact numbers live where a server provides them per
    /// chunk": on a streamed call, once the timings carry a generated-token
    /// count > 0, live snapshots publish the server's count (source
    /// `server`) instead of the estimate, and the rate window restarts on
    /// server counts. Returns a snapshot when one is due by the spacing rule
    /// (timings never change the phase); with per-chunk timings the chunk's
    /// output usually published already, so this mostly returns `None`.
    pub fn on_server_timings(&mut self, timings: &ServerTimings, now: Instant) -> Option<Snapshot> {
        if self.ended {
            return None;
        }
        self.timings.merge_from(timings);

        let server_count = timings.generated_tokens.filter(|&n| n > 0);
        if self.streamed && server_count.is_some() && !self.live_from_server {
            self.live_from_server = true;
            self.window.clear();
        }
        // Publish only with something new to show, and not before the first
        // output (the snapshot would claim tokens without a TTFT).
        let news = (server_count.is_some() && self.live_from_server) || !self.pending.is_empty();
        (news && self.first_output_at.is_some() && self.interval_passed(now))
            .then(|| self.publish(now))
    }

    /// A non-streamed response's body arrived: TTFT = time to the response
    /// body (`docs/metering.md` "Settling"). Only the first call counts.
    /// The body is the first (and only) observation of output, so its time
    /// is the TTFT even when the body carries no output text.
    pub fn on_response_body(&mut self, now: Instant) {
        if !self.ended {
            self.response_body_at.get_or_insert(now);
        }
    }

    /// Time passes with no new output: publish a snapshot if buffered text
    /// is pending and the interval has passed (so a stream that stops mid-way
    /// still shows its last count).
    pub fn tick(&mut self, now: Instant) -> Option<Snapshot> {
        if self.ended || self.pending.is_empty() {
            return None;
        }
        self.interval_passed(now).then(|| self.publish(now))
    }

    /// The stream ended normally: settle per `docs/metering.md` "Settling". Returns
    /// the final snapshot and the calibration observation (ratio) if it was a
    /// plausible drift.
    ///
    /// - Pending text is flushed. The exact count is the usage receipt's
    ///   output tokens when > 0; a receipt of 0 tokens is treated as no
    ///   receipt (servers send 0 when they didn't count, and a zero would
    ///   hide the estimate of text we saw).
    /// - `calibration_ratio` = exact / raw estimate when raw >= 20 and the
    ///   ratio is in [0.6, 1.6] ([`plausible_drift`]).
    /// - `output_tokens`: the exact count (source `provider`); else the
    ///   server's generated-token count, when it reported one (source
    ///   `server`: exact too, and better than our estimate); else the
    ///   calibrated estimate (source `estimated`).
    /// - Rate: server timings with >= 20 generated tokens and a rate the
    ///   server stated (or its own tools' formula, see
    ///   [`ServerTimings::generation_rate`]) give that rate, and the source
    ///   becomes `server` (on a final snapshot the source names where the
    ///   rate came from). The count stays the provider's when there is one:
    ///   every server we know reports the same number in both places
    ///   (llama.cpp `completion_tokens` = `predicted_n`, Ollama `eval_count`),
    ///   and the settling rules make the provider's count the final count.
    /// - Server timings that report a count below 20 give no rate at all:
    ///   the server says the output was too short to time, and the client
    ///   clock can't time the same few tokens better.
    /// - Otherwise, streamed calls only, the decode rate:
    ///   (tokens - 1) / (last output - first output), needing >= 20 tokens
    ///   and a span >= 500 ms. Tokens = the exact count when it is a
    ///   plausible drift of the estimate, else the calibrated estimate
    ///   (hidden reasoning was billed but never streamed, so it can't be
    ///   timed against the streamed span). One burst → no rate.
    ///   Non-streamed calls get a rate only from server timings.
    pub fn settle(&mut self, now: Instant) -> Settlement {
        if self.ended {
            return Settlement {
                snapshot: self.latest.clone(),
                calibration_ratio: None,
                input_tokens: self.input_tokens(),
            };
        }
        self.tokenize_pending();
        self.ended = true;

        let estimate = self.calibrated_estimate();
        let exact = self.usage.output_tokens.filter(|&n| n > 0);
        let server_count = self.timings.generated_tokens.filter(|&n| n > 0);
        let drift = exact.and_then(|e| plausible_drift(e, self.raw_estimate));
        let rate_tokens = match (exact, drift) {
            (Some(e), Some(_)) => e,
            _ => estimate,
        };

        let server_rate = self.server_rate();
        let rate = if server_rate.is_some() {
            server_rate
        } else if server_count.is_some_and(|n| n < MIN_FINAL_RATE_TOKENS) || !self.streamed {
            None
        } else {
            self.decode_rate(rate_tokens)
        };

        let (output_tokens, count_source) = match (exact, server_count) {
            (Some(e), _) => (e, TokenSource::Provider),
            (None, Some(s)) => (s, TokenSource::Server),
            (None, None) => (estimate, TokenSource::Estimated),
        };
        let token_source = if server_rate.is_some() {
            TokenSource::Server
        } else {
            count_source
        };

        self.phase = Phase::Complete;
        self.latest = Snapshot {
            stalled_ms: None,
            phase: Phase::Complete,
            is_final: true,
            elapsed_ms: self.elapsed_ms(now),
            time_to_first_token_ms: self.ttft_ms(),
            output_tokens,
            output_tokens_per_second: rate,
            token_source,
            wait: None,
        };
        self.last_published_at = Some(now);
        Settlement {
            snapshot: self.latest.clone(),
            calibration_ratio: drift,
            input_tokens: self.input_tokens(),
        }
    }

    /// The call failed (upstream error, client hung up, stream cut): phase
    /// complete, is_final, counts so far, no rate. No calibration is learned.
    ///
    /// "Counts so far": pending text is flushed into the count; if a usage
    /// receipt with output tokens > 0 already arrived (the hang-up came after
    /// it), that exact count is used (source `provider`), else the live count
    /// (server running count or calibrated estimate).
    pub fn abandon(&mut self, now: Instant) -> Snapshot {
        if self.ended {
            return self.latest.clone();
        }
        self.tokenize_pending();
        self.ended = true;
        let (output_tokens, token_source) = match self.usage.output_tokens.filter(|&n| n > 0) {
            Some(e) => (e, TokenSource::Provider),
            None => (self.live_count().round() as u64, self.live_source()),
        };
        self.phase = Phase::Complete;
        self.latest = Snapshot {
            stalled_ms: None,
            phase: Phase::Complete,
            is_final: true,
            elapsed_ms: self.elapsed_ms(now),
            time_to_first_token_ms: self.ttft_ms(),
            output_tokens,
            output_tokens_per_second: None,
            token_source,
            wait: None,
        };
        self.last_published_at = Some(now);
        self.latest.clone()
    }

    /// The latest published snapshot (the final one once settled/abandoned).
    pub fn latest(&self) -> &Snapshot {
        &self.latest
    }

    /// When the first non-empty output arrived.
    pub fn first_output_at(&self) -> Option<Instant> {
        self.first_output_at
    }

    /// When the latest non-empty output arrived.
    pub fn last_output_at(&self) -> Option<Instant> {
        self.last_output_at
    }

    /// Output tokens as last published (calibrated estimate or server count
    /// live; the settled count once final).
    pub fn output_tokens(&self) -> u64 {
        self.latest.output_tokens
    }

    /// The output count so far, with every buffered text counted: where
    /// one channel's share ends (the reasoning's, at the first answer).
    pub fn count_so_far(&mut self) -> u64 {
        self.tokenize_pending();
        self.live_count().round() as u64
    }

    /// Whether the call was settled or abandoned.
    pub fn is_ended(&self) -> bool {
        self.ended
    }

    /// The uncalibrated tokenizer count of the text flushed so far.
    pub fn raw_estimate(&self) -> u64 {
        self.raw_estimate
    }

    /// The merged usage receipt so far.
    pub fn usage(&self) -> &Usage {
        &self.usage
    }

    /// The merged server timings so far (prompt rate, load time, ...).
    pub fn server_timings(&self) -> &ServerTimings {
        &self.timings
    }

    fn interval_passed(&self, now: Instant) -> bool {
        match self.last_published_at {
            Some(at) => now.saturating_duration_since(at) >= SNAPSHOT_INTERVAL,
            None => true,
        }
    }

    /// Flush (tokenize pending text, push the window) and publish.
    fn publish(&mut self, now: Instant) -> Snapshot {
        self.tokenize_pending();
        self.window.push(now, self.live_count());
        self.last_published_at = Some(now);
        self.latest = self.live_snapshot(now);
        self.latest.clone()
    }

    fn tokenize_pending(&mut self) {
        if !self.pending.is_empty() {
            self.raw_estimate += self.estimator.count_tokens(&self.pending);
            self.pending.clear();
        }
    }

    fn live_snapshot(&self, now: Instant) -> Snapshot {
        Snapshot {
            stalled_ms: None,
            phase: self.phase,
            is_final: false,
            elapsed_ms: self.elapsed_ms(now),
            time_to_first_token_ms: self.ttft_ms(),
            output_tokens: self.live_count().round() as u64,
            output_tokens_per_second: self.live_rate(),
            token_source: self.live_source(),
            wait: None,
        }
    }

    /// The live rate of a streamed call, once its output passes the one
    /// rule every rate shown passes ([`is_timed`]: 20 tokens over 500 ms
    /// of output, so a burst held open has none): the server's running
    /// figure where it reports one, else the sliding window.
    fn live_rate(&self) -> Option<f64> {
        if !self.streamed {
            return None;
        }
        let first = self.first_output_at?;
        let span = self.last_output_at?.saturating_duration_since(first);
        if !is_timed(self.live_count(), span) {
            return None;
        }
        if self.live_from_server {
            self.live_server_rate()
                .or_else(|| self.window.rate(Some(first)))
        } else {
            self.window.rate(Some(first))
        }
    }

    /// Tokens so far, unrounded: the server's running count when it reports
    /// one, else raw × calibration.
    fn live_count(&self) -> f64 {
        match self.timings.generated_tokens {
            Some(n) if self.live_from_server => n as f64,
            _ => self.raw_estimate as f64 * self.calibration,
        }
    }

    /// While the server reports its own running speed with each chunk
    /// (llama.cpp's per-token `timings`), the live rate is that figure: a
    /// number shown with the server's counts reads what the server says.
    /// The first token opens the server's clock, so there is no figure
    /// before a second one.
    fn live_server_rate(&self) -> Option<f64> {
        let n = self.timings.generated_tokens?;
        if n < 2 {
            return None;
        }
        self.timings
            .generation_rate
            .filter(|r| r.is_finite())
            .and_then(positive_rate)
    }

    fn live_source(&self) -> TokenSource {
        if self.live_from_server {
            TokenSource::Server
        } else {
            TokenSource::Estimated
        }
    }

    fn calibrated_estimate(&self) -> u64 {
        (self.raw_estimate as f64 * self.calibration).round() as u64
    }

    fn elapsed_ms(&self, now: Instant) -> u64 {
        millis(now.saturating_duration_since(self.dispatched_at))
    }

    fn ttft_ms(&self) -> Option<u64> {
        let at = if self.streamed {
            self.first_output_at
        } else {
            self.response_body_at.or(self.first_output_at)
        };
        at.map(|t| millis(t.saturating_duration_since(self.dispatched_at)))
    }

    /// The server's own speed ([`ServerTimings::generation_rate`]: the
    /// figure it states, or its own tools' formula, decided per server by
    /// the decoder), when it timed at least `MIN_FINAL_RATE_TOKENS` tokens.
    /// A rate labelled `server` must read what the server prints, so it is
    /// taken as is, never recomputed here.
    fn server_rate(&self) -> Option<f64> {
        let n = self.timings.generated_tokens?;
        if n < MIN_FINAL_RATE_TOKENS {
            return None;
        }
        self.timings
            .generation_rate
            .filter(|r| r.is_finite())
            .and_then(positive_rate)
    }

    /// (tokens - 1) / (last output - first output): the first token arrived
    /// at TTFT and the span starts there.
    fn decode_rate(&self, tokens: u64) -> Option<f64> {
        let span = self
            .last_output_at?
            .saturating_duration_since(self.first_output_at?);
        if !is_timed(tokens as f64, span) {
            return None;
        }
        positive_rate((tokens - 1) as f64 / span.as_secs_f64())
    }

    fn input_tokens(&self) -> Option<u64> {
        self.usage.input_tokens.or_else(|| {
            self.timings
                .prompt_tokens
                .map(|p| p + self.timings.cached_tokens.unwrap_or(0))
        })
    }
}

/// Rounds to the published one decimal; a rate that rounds to 0.0 is no
/// rate (as in [`RateWindow::rate`]).
fn positive_rate(rate: f64) -> Option<f64> {
    let r = round_rate(rate);
    (r.is_finite() && r > 0.0).then_some(r)
}

fn phase_of(channel: OutputChannel) -> Phase {
    match channel {
        OutputChannel::Text => Phase::Responding,
        OutputChannel::Reasoning => Phase::Reasoning,
        OutputChannel::ToolArguments => Phase::CallingTool,
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::meter::calibration::CalibrationTable;
    use crate::tokens::WordCounter;

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    /// `n` whitespace-separated words: `n` tokens for [`WordCounter`], and
    /// chunks concatenate without merging words.
    fn words(n: usize) -> String {
        "w ".repeat(n)
    }

    fn streamed(t0: Instant) -> CallMeter {
        let mut m = CallMeter::new(t0, true, 1.0, Arc::new(WordCounter));
        m.start();
        m
    }

    fn usage(output: u64) -> Usage {
        Usage {
            output_tokens: Some(output),
            ..Usage::default()
        }
    }

    /// Timings from a server whose stated rate is count ÷ duration (as
    /// Ollama's decoder states it).
    fn timings(generated: u64, ms: f64) -> ServerTimings {
        ServerTimings {
            generated_tokens: Some(generated),
            generation_ms: Some(ms),
            generation_rate: Some(generated as f64 / (ms / 1000.0)),
            ..ServerTimings::default()
        }
    }

    /// Streams `chunks` chunks of `per_chunk` words, the first at `first_ms`
    /// and then every `every_ms`; returns the snapshots published.
    fn stream(
        m: &mut CallMeter,
        t0: Instant,
        first_ms: u64,
        every_ms: u64,
        chunks: u64,
        per_chunk: usize,
    ) -> Vec<Snapshot> {
        (0..chunks)
            .filter_map(|i| {
                m.on_output(
                    OutputChannel::Text,
                    &words(per_chunk),
                    at(t0, first_ms + i * every_ms),
                )
            })
            .collect()
    }

    /// Delegates to [`WordCounter`] and counts how often it was asked.
    #[derive(Default)]
    struct CountingEstimator {
        calls: AtomicUsize,
    }

    impl TokenEstimator for CountingEstimator {
        fn count_tokens(&self, text: &str) -> u64 {
            self.calls.fetch_add(1, Ordering::SeqCst);
            WordCounter.count_tokens(text)
        }
    }

    #[test]
    fn first_snapshot_is_awaiting_at_elapsed_zero() {
        let t0 = Instant::now();
        let mut m = CallMeter::new(t0, true, 1.0, Arc::new(WordCounter));
        let s = m.start();
        assert_eq!(s.phase, Phase::AwaitingFirstToken);
        assert!(!s.is_final);
        assert_eq!(s.elapsed_ms, 0);
        assert_eq!(s.time_to_first_token_ms, None);
        assert_eq!(s.output_tokens, 0);
        assert_eq!(s.output_tokens_per_second, None);
        assert_eq!(s.token_source, TokenSource::Estimated);
        assert_eq!(m.latest(), &s);
    }

    #[test]
    fn empty_text_neither_starts_ttft_nor_changes_phase() {
        let t0 = Instant::now();
        let mut m = streamed(t0);
        assert_eq!(m.on_output(OutputChannel::Text, "", at(t0, 300)), None);
        assert_eq!(m.on_output(OutputChannel::Reasoning, "", at(t0, 600)), None);
        assert_eq!(m.tick(at(t0, 900)), None);
        assert_eq!(m.first_output_at(), None);
        let s = m
            .on_output(OutputChannel::Text, "hi", at(t0, 1234))
            .unwrap();
        assert_eq!(s.time_to_first_token_ms, Some(1234));
        assert_eq!(s.elapsed_ms, 1234);
        assert_eq!(s.phase, Phase::Responding);
        assert_eq!(s.output_tokens, 1);
    }

    #[test]
    fn a_burst_held_open_has_no_live_rate_and_no_settled_rate() {
        let t0 = Instant::now();
        let mut m = streamed(t0);
        // 300 tokens in 30 ms (one word a 0.1 ms), then nothing for 3 s.
        for i in 0..300u64 {
            let now = t0 + Duration::from_millis(100) + Duration::from_micros(100 * i);
            let _ = m.on_output(OutputChannel::Text, "w ", now);
        }
        let mut rates = Vec::new();
        for k in 1..=12u64 {
            if let Some(s) = m.tick(at(t0, 100 + 250 * k)) {
                rates.push(s.output_tokens_per_second);
            }
        }
        assert!(!rates.is_empty(), "the pending text was published");
        assert!(rates.iter().all(Option::is_none), "{rates:?}");
        let settled = m.settle(at(t0, 3_100));
        assert_eq!(settled.snapshot.output_tokens, 300);
        assert_eq!(settled.snapshot.output_tokens_per_second, None);
    }

    #[test]
    fn a_live_rate_needs_twenty_tokens_over_half_a_second_of_output() {
        let t0 = Instant::now();
        let mut m = streamed(t0);
        // 10 tok/s: one token every 100 ms from 1 s.
        let snaps = stream(&mut m, t0, 1_000, 100, 30, 1);
        let first_rated = snaps
            .iter()
            .find(|s| s.output_tokens_per_second.is_some())
            .unwrap();
        // 500 ms of output held only 6 tokens: no rate until the 20th.
        assert!(first_rated.output_tokens >= 20, "{first_rated:?}");
        assert!(snaps
            .iter()
            .filter(|s| s.output_tokens < 20)
            .all(|s| s.output_tokens_per_second.is_none()));
        assert_eq!(first_rated.output_tokens_per_second, Some(10.0));
    }

    #[test]
    fn live_rate_excludes_the_ttft_wait() {
        let t0 = Instant::now();
        let mut m = streamed(t0);
        // First output at 2 s, then 10 tokens every 100 ms up to 4 s.
        let snaps = stream(&mut m, t0, 2000, 100, 21, 10);
        assert_eq!(snaps[0].time_to_first_token_ms, Some(2000));
        assert_eq!(snaps[0].output_tokens, 10);
        // 300 ms after the first output: too short for any rate.
        assert_eq!(snaps[1].elapsed_ms, 2300);
        assert_eq!(snaps[1].output_tokens_per_second, None);
        let rated: Vec<f64> = snaps
            .iter()
            .filter_map(|s| s.output_tokens_per_second)
            .collect();
        assert!(rated.len() >= 5, "{snaps:?}");
        // Every live rate is the decode speed, 100 tok/s; counting the 2 s
        // wait would read 70 / 2.6 s = 26.9 at the first rated snapshot.
        assert!(rated.iter().all(|&r| r == 100.0), "{rated:?}");
        for s in &snaps {
            assert_eq!(s.time_to_first_token_ms, Some(2000));
            assert_eq!(s.token_source, TokenSource::Estimated);
        }
    }

    #[test]
    fn settled_provider_count_over_the_streamed_span() {
        let t0 = Instant::now();
        let mut m = streamed(t0);
        let t1 = at(t0, 800);
        // 300 one-word chunks, the first at t1 and the last at t1 + 2.0 s.
        for i in 0..300u64 {
            let now = t1 + Duration::from_nanos(i * 2_000_000_000 / 299);
            m.on_output(OutputChannel::Text, "w ", now);
        }
        assert_eq!(m.last_output_at(), Some(at(t0, 2800)));
        m.on_usage(&usage(300));
        let s = m.settle(at(t0, 2900));
        let snap = &s.snapshot;
        assert_eq!(snap.phase, Phase::Complete);
        assert!(snap.is_final);
        assert_eq!(snap.elapsed_ms, 2900);
        assert_eq!(snap.time_to_first_token_ms, Some(800));
        assert_eq!(snap.output_tokens, 300);
        // (300 - 1) / 2.0 s.
        assert_eq!(snap.output_tokens_per_second, Some(149.5));
        assert_eq!(snap.token_source, TokenSource::Provider);
        assert_eq!(s.calibration_ratio, Some(1.0));
        assert_eq!(m.latest(), snap);
        assert_eq!(m.output_tokens(), 300);
    }

    #[test]
    fn settled_rate_uses_the_exact_count_when_it_is_plausible_drift() {
        let t0 = Instant::now();
        let mut m = streamed(t0);
        // 110 estimated tokens from 1 s to 3 s; the server counted 121.
        stream(&mut m, t0, 1000, 200, 11, 10);
        m.on_usage(&usage(121));
        let s = m.settle(at(t0, 3000));
        assert_eq!(m.raw_estimate(), 110);
        assert_eq!(s.snapshot.output_tokens, 121);
        // (121 - 1) / 2 s, not (110 - 1) / 2 s.
        assert_eq!(s.snapshot.output_tokens_per_second, Some(60.0));
        assert_eq!(s.calibration_ratio, Some(1.1));
    }

    #[test]
    fn one_burst_gets_a_count_but_no_rate() {
        let t0 = Instant::now();
        let mut m = streamed(t0);
        // 50 tokens within 100 ms.
        stream(&mut m, t0, 1000, 25, 5, 10);
        m.on_usage(&usage(50));
        let s = m.settle(at(t0, 1200)).snapshot;
        assert_eq!(s.output_tokens, 50);
        assert_eq!(s.output_tokens_per_second, None);
        assert_eq!(s.token_source, TokenSource::Provider);
        assert_eq!(s.time_to_first_token_ms, Some(1000));
    }

    #[test]
    fn server_timing_outranks_the_client_clock() {
        let t0 = Instant::now();
        let mut m = streamed(t0);
        // The client saw 100 tokens over 0.9 s: (100 - 1) / 0.9 = 110.
        stream(&mut m, t0, 500, 100, 10, 10);
        m.on_usage(&usage(100));
        m.on_server_timings(&timings(100, 500.0), at(t0, 1400));
        let s = m.settle(at(t0, 1400));
        assert_eq!(s.snapshot.output_tokens_per_second, Some(200.0));
        assert_eq!(s.snapshot.token_source, TokenSource::Server);
        assert_eq!(s.snapshot.output_tokens, 100);
        // Calibration still learns from the provider count.
        assert_eq!(s.calibration_ratio, Some(1.0));
    }

    #[test]
    fn server_rate_keeps_the_provider_count_when_both_exist() {
        let t0 = Instant::now();
        let mut m = streamed(t0);
        stream(&mut m, t0, 500, 100, 20, 10);
        m.on_usage(&usage(201));
        m.on_server_timings(&timings(200, 4000.0), at(t0, 2500));
        let s = m.settle(at(t0, 2500)).snapshot;
        assert_eq!(s.output_tokens, 201);
        assert_eq!(s.output_tokens_per_second, Some(50.0));
        assert_eq!(s.token_source, TokenSource::Server);
    }

    #[test]
    fn server_count_without_usage_is_the_final_count() {
        let t0 = Instant::now();
        let mut m = streamed(t0);
        stream(&mut m, t0, 500, 100, 10, 10);
        // Timings with a count but no usable duration (dropped by the
        // decoder): count from the server, rate from the client clock.
        m.on_server_timings(
            &ServerTimings {
                generated_tokens: Some(91),
                ..ServerTimings::default()
            },
            at(t0, 1400),
        );
        let s = m.settle(at(t0, 1400)).snapshot;
        assert_eq!(s.output_tokens, 91);
        assert_eq!(s.token_source, TokenSource::Server);
        // Decode rate over the estimate (no exact count to calibrate with):
        // (100 - 1) / 0.9 s.
        assert_eq!(s.output_tokens_per_second, Some(110.0));
    }

    #[test]
    fn server_timings_below_twenty_tokens_give_no_rate() {
        let t0 = Instant::now();
        let mut m = streamed(t0);
        // The estimate says 30 tokens over 2 s (the decode rate alone would
        // read 14.5), the server says it generated 19.
        stream(&mut m, t0, 500, 1000, 3, 10);
        m.on_server_timings(&timings(19, 1900.0), at(t0, 2600));
        let s = m.settle(at(t0, 2600)).snapshot;
        assert_eq!(s.output_tokens, 19);
        assert_eq!(s.output_tokens_per_second, None);
        assert_eq!(s.token_source, TokenSource::Server);
    }

    #[test]
    fn server_timings_with_zero_duration_fall_back_to_the_decode_rate() {
        let t0 = Instant::now();
        let mut m = streamed(t0);
        stream(&mut m, t0, 1000, 200, 11, 10);
        m.on_usage(&usage(110));
        m.on_server_timings(&timings(110, 0.0), at(t0, 3000));
        let s = m.settle(at(t0, 3000)).snapshot;
        assert_eq!(s.output_tokens_per_second, Some(54.5));
        assert_eq!(s.token_source, TokenSource::Provider);
    }

    #[test]
    fn hidden_reasoning_reports_the_bill_but_rates_the_streamed_tokens() {
        let t0 = Instant::now();
        let mut m = streamed(t0);
        // 55 visible tokens from 1 s to 3 s; the bill says 2000.
        stream(&mut m, t0, 1000, 200, 11, 5);
        m.on_usage(&usage(2000));
        let s = m.settle(at(t0, 3100));
        assert_eq!(s.snapshot.output_tokens, 2000);
        assert_eq!(s.snapshot.token_source, TokenSource::Provider);
        // (55 - 1) / 2 s: the streamed tokens over the streamed span.
        assert_eq!(s.snapshot.output_tokens_per_second, Some(27.0));
        assert_eq!(s.calibration_ratio, None);
        let mut table = CalibrationTable::new();
        if let Some(r) = s.calibration_ratio {
            table.observe("A", "m", r);
        }
        assert_eq!(table.factor("A", "m"), 1.0);
    }

    #[test]
    fn calibration_is_learned_per_route_and_model() {
        let t0 = Instant::now();
        let mut table = CalibrationTable::new();

        // Route A / model m: raw 100, exact 150.
        let mut m = CallMeter::new(t0, true, table.factor("A", "m"), Arc::new(WordCounter));
        m.start();
        stream(&mut m, t0, 100, 100, 10, 10);
        m.on_usage(&usage(150));
        let s = m.settle(at(t0, 1100));
        assert_eq!(s.calibration_ratio, Some(1.5));
        table.observe("A", "m", s.calibration_ratio.unwrap());

        // Next call on A / m: raw 100 reads 150, live and settled.
        let mut m = CallMeter::new(t0, true, table.factor("A", "m"), Arc::new(WordCounter));
        m.start();
        let live = m
            .on_output(OutputChannel::Text, &words(100), at(t0, 100))
            .unwrap();
        assert_eq!(live.output_tokens, 150);
        assert_eq!(live.token_source, TokenSource::Estimated);
        let s = m.settle(at(t0, 200));
        assert_eq!(s.snapshot.output_tokens, 150);
        assert_eq!(s.snapshot.token_source, TokenSource::Estimated);
        assert_eq!(s.calibration_ratio, None);

        // Route B (same model) and A with another model are unaffected.
        for (route, model) in [("B", "m"), ("A", "other")] {
            let mut m = CallMeter::new(t0, true, table.factor(route, model), Arc::new(WordCounter));
            m.start();
            let live = m
                .on_output(OutputChannel::Text, &words(100), at(t0, 100))
                .unwrap();
            assert_eq!(live.output_tokens, 100, "{route}/{model}");
        }

        // A second observation on A / m moves the factor to the midpoint.
        table.observe("A", "m", 1.0);
        assert_eq!(table.factor("A", "m"), 1.25);
    }

    #[test]
    fn calibrated_call_learns_from_the_raw_estimate() {
        let t0 = Instant::now();
        // Factor 1.5 already: the ratio is still exact / raw, not exact /
        // calibrated, so the table's midpoint rule stays meaningful.
        let mut m = CallMeter::new(t0, true, 1.5, Arc::new(WordCounter));
        m.start();
        stream(&mut m, t0, 100, 100, 10, 10);
        m.on_usage(&usage(140));
        let s = m.settle(at(t0, 1100));
        assert_eq!(s.calibration_ratio, Some(1.4));
    }

    #[test]
    fn phases_follow_the_channels_and_publish_at_once() {
        let t0 = Instant::now();
        let mut m = streamed(t0);
        assert_eq!(m.latest().phase, Phase::AwaitingFirstToken);
        let s = m
            .on_output(OutputChannel::Reasoning, "let me think", at(t0, 100))
            .unwrap();
        assert_eq!(s.phase, Phase::Reasoning);
        assert_eq!(s.output_tokens, 3);
        assert_eq!(s.time_to_first_token_ms, Some(100));
        // Same phase within 250 ms: nothing. (No trailing space: the channel
        // switch below must not glue "more" to the tool arguments.)
        assert_eq!(
            m.on_output(OutputChannel::Reasoning, "more", at(t0, 120)),
            None
        );
        let s = m
            .on_output(
                OutputChannel::ToolArguments,
                r#"{"city": "Oslo"}"#,
                at(t0, 150),
            )
            .unwrap();
        assert_eq!(s.phase, Phase::CallingTool);
        assert_eq!(s.output_tokens, 6);
        let s = m
            .on_output(OutputChannel::Text, "It is sunny", at(t0, 160))
            .unwrap();
        assert_eq!(s.phase, Phase::Responding);
        // Reasoning, tool arguments and text all count.
        assert_eq!(s.output_tokens, 9);
        assert_eq!(s.elapsed_ms, 160);
        // TTFT stays the first output of any channel.
        assert_eq!(s.time_to_first_token_ms, Some(100));
        // A tool call after text is `calling_tool` again.
        let s = m
            .on_output(OutputChannel::ToolArguments, "{}", at(t0, 170))
            .unwrap();
        assert_eq!(s.phase, Phase::CallingTool);
    }

    #[test]
    fn snapshots_are_spaced_and_tokenization_is_buffered() {
        let t0 = Instant::now();
        let est = Arc::new(CountingEstimator::default());
        let mut m = CallMeter::new(t0, true, 1.0, est.clone());
        m.start();
        // One word every 50 ms from 50 ms to 1000 ms: 20 chunks.
        let published: Vec<(u64, Snapshot)> = (1..=20u64)
            .filter_map(|i| {
                m.on_output(OutputChannel::Text, "w ", at(t0, i * 50))
                    .map(|s| (i, s))
            })
            .collect();
        let idx: Vec<u64> = published.iter().map(|(i, _)| *i).collect();
        // Every 5th chunk: 50 (phase change), 300, 550, 800 ms.
        assert_eq!(idx, vec![1, 6, 11, 16]);
        let counts: Vec<u64> = published.iter().map(|(_, s)| s.output_tokens).collect();
        assert_eq!(counts, vec![1, 6, 11, 16]);
        // Tokenized once per snapshot, not once per chunk.
        assert_eq!(est.calls.load(Ordering::SeqCst), 4);
        // Chunks 17..=20 are buffered; a tick shows them once 250 ms passed.
        assert_eq!(m.tick(at(t0, 1049)), None);
        assert_eq!(est.calls.load(Ordering::SeqCst), 4);
        let s = m.tick(at(t0, 1050)).unwrap();
        assert_eq!(s.output_tokens, 20);
        assert_eq!(s.elapsed_ms, 1050);
        assert_eq!(est.calls.load(Ordering::SeqCst), 5);
        // Nothing pending: ticks publish nothing and tokenize nothing.
        assert_eq!(m.tick(at(t0, 5000)), None);
        assert_eq!(est.calls.load(Ordering::SeqCst), 5);
    }

    #[test]
    fn live_rate_follows_a_slowdown() {
        let t0 = Instant::now();
        let mut m = streamed(t0);
        stream(&mut m, t0, 0, 100, 11, 10);
        assert_eq!(m.latest().output_tokens_per_second, Some(100.0));
        // A trickle long after: the window spans > 2 s; rate reflects it.
        let s = m
            .on_output(OutputChannel::Text, "w ", at(t0, 5000))
            .unwrap();
        assert!(s.output_tokens_per_second.unwrap() < 100.0, "{s:?}");
    }

    #[test]
    fn fewer_than_twenty_tokens_get_no_final_rate() {
        let t0 = Instant::now();
        let mut m = streamed(t0);
        stream(&mut m, t0, 0, 100, 19, 1);
        let s = m.settle(at(t0, 2000)).snapshot;
        assert_eq!(s.output_tokens, 19);
        assert_eq!(s.output_tokens_per_second, None);
        assert_eq!(s.token_source, TokenSource::Estimated);

        let mut m = streamed(t0);
        stream(&mut m, t0, 0, 100, 20, 1);
        let s = m.settle(at(t0, 2000)).snapshot;
        // (20 - 1) / 1.9 s.
        assert_eq!(s.output_tokens_per_second, Some(10.0));
    }

    #[test]
    fn a_final_rate_needs_half_a_second_of_streaming() {
        let t0 = Instant::now();
        let mut m = streamed(t0);
        // 100 tokens, first to last 499 ms.
        m.on_output(OutputChannel::Text, &words(50), at(t0, 1000));
        m.on_output(OutputChannel::Text, &words(50), at(t0, 1499));
        let s = m.settle(at(t0, 2000)).snapshot;
        assert_eq!(s.output_tokens_per_second, None);

        let mut m = streamed(t0);
        m.on_output(OutputChannel::Text, &words(50), at(t0, 1000));
        m.on_output(OutputChannel::Text, &words(50), at(t0, 1500));
        let s = m.settle(at(t0, 2000)).snapshot;
        assert_eq!(s.output_tokens_per_second, Some(198.0));
    }

    #[test]
    fn zero_usage_counts_as_no_receipt() {
        let t0 = Instant::now();
        let mut m = streamed(t0);
        stream(&mut m, t0, 0, 100, 11, 10);
        m.on_usage(&usage(0));
        let s = m.settle(at(t0, 1100));
        assert_eq!(s.snapshot.output_tokens, 110);
        assert_eq!(s.snapshot.token_source, TokenSource::Estimated);
        assert_eq!(s.calibration_ratio, None);
    }

    #[test]
    fn later_usage_wins_field_by_field() {
        let t0 = Instant::now();
        let mut m = streamed(t0);
        stream(&mut m, t0, 0, 100, 11, 10);
        m.on_usage(&Usage {
            input_tokens: Some(37),
            output_tokens: Some(5),
            ..Usage::default()
        });
        m.on_usage(&usage(110));
        let s = m.settle(at(t0, 1100));
        assert_eq!(s.snapshot.output_tokens, 110);
        assert_eq!(s.input_tokens, Some(37));
    }

    #[test]
    fn input_tokens_fall_back_to_server_timings() {
        let t0 = Instant::now();
        let mut m = streamed(t0);
        m.on_output(OutputChannel::Text, "hi", at(t0, 100));
        m.on_server_timings(
            &ServerTimings {
                prompt_tokens: Some(12),
                cached_tokens: Some(30),
                ..ServerTimings::default()
            },
            at(t0, 200),
        );
        assert_eq!(m.settle(at(t0, 200)).input_tokens, Some(42));
    }

    #[test]
    fn abandon_keeps_counts_and_gives_no_rate() {
        let t0 = Instant::now();
        let mut m = streamed(t0);
        // 11 chunks from 0.3 s to 1.3 s; the last one is still buffered.
        stream(&mut m, t0, 300, 100, 11, 3);
        assert_eq!(m.output_tokens(), 30);
        let s = m.abandon(at(t0, 1500));
        assert_eq!(s.phase, Phase::Complete);
        assert!(s.is_final);
        assert_eq!(s.elapsed_ms, 1500);
        assert_eq!(s.time_to_first_token_ms, Some(300));
        // Buffered text counted too.
        assert_eq!(s.output_tokens, 33);
        assert_eq!(s.output_tokens_per_second, None);
        assert_eq!(s.token_source, TokenSource::Estimated);
        // Closed: later events change nothing, settling repeats the snapshot.
        assert_eq!(m.on_output(OutputChannel::Text, "more", at(t0, 1600)), None);
        assert_eq!(m.tick(at(t0, 2000)), None);
        let again = m.settle(at(t0, 2000));
        assert_eq!(again.snapshot, s);
        assert_eq!(again.calibration_ratio, None);
        assert_eq!(m.abandon(at(t0, 3000)), s);
    }

    #[test]
    fn abandon_before_any_output_has_no_ttft() {
        let t0 = Instant::now();
        let mut m = streamed(t0);
        let s = m.abandon(at(t0, 700));
        assert_eq!(s.time_to_first_token_ms, None);
        assert_eq!(s.output_tokens, 0);
        assert_eq!(s.phase, Phase::Complete);
    }

    #[test]
    fn non_streamed_ttft_is_the_body_and_only_server_timings_rate_it() {
        let t0 = Instant::now();
        let mut m = CallMeter::new(t0, false, 1.0, Arc::new(WordCounter));
        m.start();
        m.on_response_body(at(t0, 3000));
        m.on_output(OutputChannel::Text, &words(100), at(t0, 3001));
        m.on_usage(&usage(100));
        let s = m.settle(at(t0, 3002)).snapshot;
        assert_eq!(s.time_to_first_token_ms, Some(3000));
        assert_eq!(s.output_tokens, 100);
        assert_eq!(s.output_tokens_per_second, None);
        assert_eq!(s.token_source, TokenSource::Provider);

        // Even with output "spread" over time, the client clock never rates
        // a non-streamed body.
        let mut m = CallMeter::new(t0, false, 1.0, Arc::new(WordCounter));
        m.start();
        m.on_response_body(at(t0, 3000));
        m.on_output(OutputChannel::Reasoning, &words(50), at(t0, 3000));
        let live = m
            .on_output(OutputChannel::Text, &words(50), at(t0, 4000))
            .unwrap();
        assert_eq!(live.output_tokens_per_second, None);
        m.on_usage(&usage(100));
        m.on_server_timings(&timings(100, 2000.0), at(t0, 4000));
        let s = m.settle(at(t0, 4000)).snapshot;
        assert_eq!(s.time_to_first_token_ms, Some(3000));
        assert_eq!(s.output_tokens_per_second, Some(50.0));
        assert_eq!(s.token_source, TokenSource::Server);
    }

    #[test]
    fn live_count_follows_the_server_running_count() {
        let t0 = Instant::now();
        let mut m = streamed(t0);
        let mut published = Vec::new();
        // Each chunk: 10 words of text, then the server's running count,
        // which says 8 tokens per chunk (its tokenizer differs from ours).
        for i in 0..=20u64 {
            let now = at(t0, 1000 + i * 100);
            published.extend(m.on_output(OutputChannel::Text, &words(10), now));
            published.extend(m.on_server_timings(&timings(8 * (i + 1), 0.0), now));
        }
        // The first chunk's snapshot came before any server count.
        assert_eq!(published[0].token_source, TokenSource::Estimated);
        assert_eq!(published[0].output_tokens, 10);
        let last = published.last().unwrap();
        assert_eq!(last.token_source, TokenSource::Server);
        // Published at 2.8 s, with the count the server had sent by then.
        assert_eq!(last.elapsed_ms, 2800);
        assert_eq!(last.output_tokens, 8 * 18);
        // 80 server tokens per second, never mixed with the estimate.
        assert_eq!(last.output_tokens_per_second, Some(80.0));
        for s in &published[1..] {
            assert_eq!(s.token_source, TokenSource::Server, "{s:?}");
            if let Some(r) = s.output_tokens_per_second {
                assert_eq!(r, 80.0, "{s:?}");
            }
        }
    }

    #[test]
    fn a_non_positive_calibration_is_ignored() {
        let t0 = Instant::now();
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let mut m = CallMeter::new(t0, true, bad, Arc::new(WordCounter));
            m.start();
            let s = m
                .on_output(OutputChannel::Text, &words(10), at(t0, 10))
                .unwrap();
            assert_eq!(s.output_tokens, 10, "{bad}");
        }
    }

    #[test]
    fn drift_band_edges_decide_calibration() {
        let t0 = Instant::now();
        let settle_with = |raw: usize, exact: u64| {
            let mut m = streamed(t0);
            m.on_output(OutputChannel::Text, &words(raw), at(t0, 100));
            m.on_usage(&usage(exact));
            m.settle(at(t0, 200))
        };
        assert_eq!(settle_with(100, 60).calibration_ratio, Some(0.6));
        assert_eq!(settle_with(100, 160).calibration_ratio, Some(1.6));
        assert_eq!(settle_with(100, 59).calibration_ratio, None);
        assert_eq!(settle_with(100, 161).calibration_ratio, None);
        // Raw estimate under 20: never calibrates, even at ratio 1.0.
        assert_eq!(settle_with(19, 19).calibration_ratio, None);
        assert_eq!(settle_with(20, 20).calibration_ratio, Some(1.0));
        // Out of band: the count is still the provider's.
        let s = settle_with(100, 59).snapshot;
        assert_eq!(s.output_tokens, 59);
        assert_eq!(s.token_source, TokenSource::Provider);
    }

    #[test]
    fn out_of_band_exact_count_rates_the_calibrated_estimate() {
        let t0 = Instant::now();
        let mut m = CallMeter::new(t0, true, 1.2, Arc::new(WordCounter));
        m.start();
        // Raw 110 over 2 s; the bill (400) is out of band.
        stream(&mut m, t0, 1000, 200, 11, 10);
        m.on_usage(&usage(400));
        let s = m.settle(at(t0, 3000));
        assert_eq!(s.snapshot.output_tokens, 400);
        assert_eq!(s.calibration_ratio, None);
        // Calibrated estimate: round(110 × 1.2) = 132 → (132 - 1) / 2 s.
        assert_eq!(s.snapshot.output_tokens_per_second, Some(65.5));
    }
}
