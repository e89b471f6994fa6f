//! What one simulated request will do: the configured script, overridden by
//! the request's `x-sim-*` headers, and the few body fields that shape the
//! reply. Pure: no I/O, no clock (instants are passed in).

use std::time::Duration;

use http::HeaderMap;
use tokio::time::Instant;

use super::{Overflow, SimConfig};

/// `x-sim-ttft-ms`: request arrival to first token, in ms.
pub(crate) const H_TTFT_MS: &str = "x-sim-ttft-ms";
/// `x-sim-tps`: tokens per second (> 0).
pub(crate) const H_TPS: &str = "x-sim-tps";
/// `x-sim-tokens`: answer tokens.
pub(crate) const H_TOKENS: &str = "x-sim-tokens";
/// `x-sim-reasoning`: reasoning tokens before the answer.
pub(crate) const H_REASONING: &str = "x-sim-reasoning";
/// `x-sim-usage`: `true`/`false`, always send a usage receipt.
pub(crate) const H_USAGE: &str = "x-sim-usage";
/// `x-sim-server-timings`: `true`/`false`.
pub(crate) const H_SERVER_TIMINGS: &str = "x-sim-server-timings";
/// `x-sim-usage-factor`: reported counts = round(tokens * factor).
pub(crate) const H_USAGE_FACTOR: &str = "x-sim-usage-factor";
/// `x-sim-status`: reply this 4xx/5xx status with a JSON error after ttft.
pub(crate) const H_STATUS: &str = "x-sim-status";
/// `x-sim-cut-after`: abort the connection after N tokens.
pub(crate) const H_CUT_AFTER: &str = "x-sim-cut-after";
/// `x-sim-error-after`: in-protocol error event after N tokens, clean end.
pub(crate) const H_ERROR_AFTER: &str = "x-sim-error-after";
/// `x-sim-keepalive-ms`: SSE `: ping` comments every N ms before the first token.
pub(crate) const H_KEEPALIVE_MS: &str = "x-sim-keepalive-ms";
/// `x-sim-stall-after`: the stream stalls after N output tokens.
pub(crate) const H_STALL_AFTER: &str = "x-sim-stall-after";
/// `x-sim-stall-ms`: how long that stall lasts, ms.
pub(crate) const H_STALL_MS: &str = "x-sim-stall-ms";

/// `x-sim-prompt-tokens`: the prompt's token count, instead of the
/// `ceil(body bytes / 4)` estimate.
pub(crate) const H_PROMPT_TOKENS: &str = "x-sim-prompt-tokens";
/// `x-sim-prefill-tps`: prompt processing rate, tokens per second (> 0).
pub(crate) const H_PREFILL_TPS: &str = "x-sim-prefill-tps";
/// `x-sim-load-ms`: load time, when this call finds its model unloaded.
pub(crate) const H_LOAD_MS: &str = "x-sim-load-ms";
/// `x-sim-keep-alive-ms`: idle time before the model unloads after this
/// call (negative: never; 0: at once).
pub(crate) const H_KEEP_ALIVE_MS: &str = "x-sim-keep-alive-ms";
/// `x-sim-overflow`: `auto`, `refuse` or `truncate` (see `Overflow`).
pub(crate) const H_OVERFLOW: &str = "x-sim-overflow";
/// `x-sim-draft-acceptance`: speculative decoding acceptance, 0..=1.
pub(crate) const H_DRAFT_ACCEPTANCE: &str = "x-sim-draft-acceptance";
/// `x-sim-vram-fraction`: share of the model in VRAM, 0..=1, applied when
/// this call loads the model.
pub(crate) const H_VRAM_FRACTION: &str = "x-sim-vram-fraction";

/// Offsets beyond this are clamped: a schedule a century long is as good as
/// "never" and keeps `Instant` arithmetic from overflowing.
const FAR: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// How a stream ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ending {
    /// Every token, then the protocol's closing events.
    Finish,
    /// An in-protocol error event, then a clean end of the body.
    Error,
    /// The connection is aborted with no closing events (incomplete body).
    Cut,
}

/// When one admitted call passed each stage before its first token.
///
/// TTFT = (`start` - `arrival`: waiting for the model to load, then for a
/// slot) + prefill (`prompt tokens / prefill rate`) + the plan's base
/// `ttft`. Token `i` is due at `origin + ttft + i / tps`, where `origin`
/// is `start + prefill`; with no load, no slot limit and no prefill rate
/// `origin` is the arrival, as it always was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Timeline {
    /// The request head arrived.
    pub arrival: Instant,
    /// The call holds a slot and its model is loaded: the prompt starts.
    pub start: Instant,
    /// The prompt is processed; the base ttft runs from here.
    pub origin: Instant,
    /// How long this call waited for its model to load.
    pub load: Duration,
}

#[cfg(test)]
impl Timeline {
    /// A call that started at once with an instant prefill.
    pub(crate) fn immediate(arrival: Instant) -> Timeline {
        Timeline {
            arrival,
            start: arrival,
            origin: arrival,
            load: Duration::ZERO,
        }
    }
}

/// The resolved script of one request.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Plan {
    pub ttft: Duration,
    pub tokens_per_second: f64,
    pub reasoning: u64,
    pub answer: u64,
    pub usage: bool,
    pub server_timings: bool,
    pub usage_factor: f64,
    pub status: Option<u16>,
    pub cut_after: Option<u64>,
    pub error_after: Option<u64>,
    pub keepalive: Option<Duration>,
    /// Tokens from this index on come `stall` later (a stall mid-stream).
    pub stall_after: Option<u64>,
    pub stall: Duration,
    /// `x-sim-prompt-tokens`, when given.
    pub prompt_tokens: Option<u64>,
    /// Prefill rate; `None` is an instant prefill.
    pub prefill_tps: Option<f64>,
    pub load_time: Duration,
    /// `None`: the model never unloads.
    pub keep_alive: Option<Duration>,
    pub overflow: Overflow,
    pub draft_acceptance: Option<f64>,
    pub vram_fraction: f64,
}

/// Checks the numbers a script needs to be playable. Used for the server's
/// configuration and for every request's overrides.
pub(crate) fn validate(config: &SimConfig) -> Result<(), String> {
    if !(config.tokens_per_second.is_finite() && config.tokens_per_second > 0.0) {
        return Err(format!(
            "tokens per second must be a finite number > 0, got {}",
            config.tokens_per_second
        ));
    }
    if !(config.usage_factor.is_finite() && config.usage_factor >= 0.0) {
        return Err(format!(
            "usage factor must be a finite number >= 0, got {}",
            config.usage_factor
        ));
    }
    if let Some(rate) = config.prefill_tokens_per_second {
        if !(rate.is_finite() && rate > 0.0) {
            return Err(format!(
                "prefill tokens per second must be a finite number > 0, got {rate}"
            ));
        }
    }
    if let Some(a) = config.draft_acceptance {
        if !(0.0..=1.0).contains(&a) {
            return Err(format!("draft acceptance must be within 0..=1, got {a}"));
        }
    }
    if !(0.0..=1.0).contains(&config.vram_fraction) {
        return Err(format!(
            "vram fraction must be within 0..=1, got {}",
            config.vram_fraction
        ));
    }
    if config.slots == Some(0) {
        return Err("slots must be at least 1".into());
    }
    if config.ping_interval == Some(Duration::ZERO) {
        return Err("ping interval must be > 0".into());
    }
    if config.n_ctx == 0 {
        return Err("n_ctx must be at least 1".into());
    }
    Ok(())
}

impl Plan {
    /// The configured script with the request's `x-sim-*` overrides. An
    /// override that doesn't parse is an error naming the header (the
    /// caller replies 400) rather than being silently ignored: a test or
    /// benchmark that misspells a value should fail loudly.
    pub(crate) fn new(config: &SimConfig, headers: &HeaderMap) -> Result<Plan, String> {
        let mut c = config.clone();
        if let Some(ms) = parse::<u64>(headers, H_TTFT_MS)? {
            c.ttft = Duration::from_millis(ms);
        }
        if let Some(v) = parse::<f64>(headers, H_TPS)? {
            c.tokens_per_second = v;
        }
        if let Some(v) = parse::<u64>(headers, H_TOKENS)? {
            c.tokens = v;
        }
        if let Some(v) = parse::<u64>(headers, H_REASONING)? {
            c.reasoning_tokens = v;
        }
        if let Some(v) = parse::<bool>(headers, H_USAGE)? {
            c.usage = v;
        }
        if let Some(v) = parse::<bool>(headers, H_SERVER_TIMINGS)? {
            c.server_timings = v;
        }
        if let Some(v) = parse::<f64>(headers, H_USAGE_FACTOR)? {
            c.usage_factor = v;
        }
        if let Some(v) = parse::<f64>(headers, H_PREFILL_TPS)? {
            c.prefill_tokens_per_second = Some(v);
        }
        if let Some(ms) = parse::<u64>(headers, H_LOAD_MS)? {
            c.load_time = Duration::from_millis(ms);
        }
        if let Some(ms) = parse::<i64>(headers, H_KEEP_ALIVE_MS)? {
            c.keep_alive = u64::try_from(ms).ok().map(Duration::from_millis);
        }
        if let Some(v) = parse::<Overflow>(headers, H_OVERFLOW)? {
            c.overflow = v;
        }
        if let Some(v) = parse::<f64>(headers, H_DRAFT_ACCEPTANCE)? {
            c.draft_acceptance = Some(v);
        }
        if let Some(v) = parse::<f64>(headers, H_VRAM_FRACTION)? {
            c.vram_fraction = v;
        }
        if let Some(v) = parse::<u64>(headers, H_STALL_AFTER)? {
            c.stall_after_tokens = Some(v);
        }
        if let Some(ms) = parse::<u64>(headers, H_STALL_MS)? {
            c.stall = Duration::from_millis(ms);
        }
        validate(&c).map_err(|e| format!("bad x-sim-* override: {e}"))?;
        let status = parse::<u16>(headers, H_STATUS)?;
        if let Some(s) = status {
            if !(400..=599).contains(&s) {
                return Err(format!("{H_STATUS} must be a 4xx or 5xx status, got {s}"));
            }
        }
        let keepalive = match parse::<u64>(headers, H_KEEPALIVE_MS)? {
            Some(0) => return Err(format!("{H_KEEPALIVE_MS} must be > 0")),
            Some(ms) => Some(Duration::from_millis(ms)),
            None => c.ping_interval,
        };
        Ok(Plan {
            ttft: c.ttft,
            tokens_per_second: c.tokens_per_second,
            reasoning: c.reasoning_tokens,
            answer: c.tokens,
            usage: c.usage,
            server_timings: c.server_timings,
            usage_factor: c.usage_factor,
            status,
            cut_after: parse::<u64>(headers, H_CUT_AFTER)?,
            error_after: parse::<u64>(headers, H_ERROR_AFTER)?,
            keepalive,
            stall_after: c.stall_after_tokens,
            stall: c.stall,
            prompt_tokens: parse::<u64>(headers, H_PROMPT_TOKENS)?,
            prefill_tps: c.prefill_tokens_per_second,
            load_time: c.load_time,
            keep_alive: c.keep_alive,
            overflow: c.overflow,
            draft_acceptance: c.draft_acceptance,
            vram_fraction: c.vram_fraction,
        })
    }

    /// How long the prefill of `prompt_tokens` takes (zero without a rate).
    pub(crate) fn prefill(&self, prompt_tokens: u64) -> Duration {
        match self.prefill_tps {
            Some(rate) => Duration::try_from_secs_f64(prompt_tokens as f64 / rate)
                .unwrap_or(FAR)
                .min(FAR),
            None => Duration::ZERO,
        }
    }

    /// Speculative decoding counts for `output_tokens` (as the server
    /// counts them): every output token was drafted once and the accepted
    /// share is rounded. A stand-in for llama.cpp's per-step drafting that
    /// keeps `draft_n_accepted / draft_n` at the configured acceptance.
    /// `None` without a draft model or without output (llama.cpp omits
    /// the fields when `draft_n` is 0).
    pub(crate) fn drafts(&self, output_tokens: u64) -> Option<(u64, u64)> {
        let acceptance = self.draft_acceptance?;
        (output_tokens > 0).then(|| {
            let accepted = (output_tokens as f64 * acceptance).round() as u64;
            (output_tokens, accepted.min(output_tokens))
        })
    }

    /// All output tokens: reasoning then answer.
    pub(crate) fn total(&self) -> u64 {
        self.reasoning.saturating_add(self.answer)
    }

    /// When token `index` is due: `arrival + ttft + index / tps` (plus the
    /// stall, from the token after it on), computed from the absolute start
    /// each time so rounding never accumulates.
    pub(crate) fn deadline(&self, arrival: Instant, index: u64) -> Instant {
        let offset = Duration::try_from_secs_f64(index as f64 / self.tokens_per_second)
            .unwrap_or(FAR)
            .min(FAR);
        let stalled = match self.stall_after {
            Some(n) if index >= n && n > 0 => self.stall.min(FAR),
            _ => Duration::ZERO,
        };
        arrival + self.ttft.min(FAR) + offset + stalled
    }

    /// When the response is complete: the last token's deadline (the
    /// closing events go out with it), or the first-token time when there
    /// are no tokens. A non-streamed reply is sent at this instant too, so
    /// both modes finish at the same moment.
    pub(crate) fn end(&self, arrival: Instant) -> Instant {
        self.deadline(arrival, self.total().saturating_sub(1))
    }

    /// A count as the simulated server's tokenizer reports it.
    pub(crate) fn exact(&self, streamed: u64) -> u64 {
        (streamed as f64 * self.usage_factor).round() as u64
    }

    /// How many tokens are written and how the body ends. A fault whose N
    /// is beyond the output never fires (the stream finishes first); when
    /// both faults name the same N the cut wins, being the harsher one.
    pub(crate) fn stop(&self) -> (u64, Ending) {
        let total = self.total();
        let cut = self.cut_after.filter(|&n| n <= total);
        let err = self.error_after.filter(|&n| n <= total);
        match (cut, err) {
            (Some(c), Some(e)) if e < c => (e, Ending::Error),
            (Some(c), _) => (c, Ending::Cut),
            (None, Some(e)) => (e, Ending::Error),
            (None, None) => (total, Ending::Finish),
        }
    }
}

fn parse<T: std::str::FromStr>(headers: &HeaderMap, name: &str) -> Result<Option<T>, String> {
    let Some(value) = headers.get(name) else {
        return Ok(None);
    };
    let text = value
        .to_str()
        .map_err(|_| format!("{name}: value is not text"))?
        .trim();
    text.parse::<T>()
        .map(Some)
        .map_err(|_| format!("{name}: cannot parse {text:?}"))
}

/// The body fields that shape the reply. Everything else in the body is
/// ignored and dropped with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BodyFlags {
    /// The request's `stream` (or the route's default when absent).
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// The requested model, echoed back (default `sim-model`).
    pub model: String,
    /// A stable stand-in prompt size: `ceil(body bytes / 4)`, at least 1,
    /// roughly a tokenizer's count for English JSON, computed without
    /// keeping or reading the text itself.
    pub prompt_tokens: u64,
    /// Ollama's `keep_alive` field: `Some(None)` is "forever" (negative),
    /// `Some(Some(d))` a duration, `None` absent or unreadable.
    pub keep_alive: Option<Option<Duration>>,
}

/// The model named when the request names none (and the only one listed).
pub(crate) const DEFAULT_MODEL: &str = "sim-model";

impl BodyFlags {
    /// Reads the flags from a request body. An empty body is `{}` (handy for
    /// `curl -X POST`); anything else must be a JSON object. `stream` of a
    /// non-boolean type falls back to `default_stream`, as lenient servers do.
    pub(crate) fn parse(body: &[u8], default_stream: bool) -> Result<BodyFlags, String> {
        let prompt_tokens = (body.len() as u64).div_ceil(4).max(1);
        let value: serde_json::Value = if body.iter().all(u8::is_ascii_whitespace) {
            serde_json::Value::Object(Default::default())
        } else {
            serde_json::from_slice(body).map_err(|e| format!("request body is not JSON: {e}"))?
        };
        let obj = value
            .as_object()
            .ok_or_else(|| String::from("request body is not a JSON object"))?;
        Ok(BodyFlags {
            stream: obj
                .get("stream")
                .and_then(|v| v.as_bool())
                .unwrap_or(default_stream),
            include_usage: obj
                .get("stream_options")
                .and_then(|o| o.get("include_usage"))
                .and_then(|v| v.as_bool())
                .unwrap_or(false),
            model: obj
                .get("model")
                .and_then(|v| v.as_str())
                .filter(|m| !m.is_empty())
                .unwrap_or(DEFAULT_MODEL)
                .to_owned(),
            prompt_tokens,
            keep_alive: obj.get("keep_alive").and_then(keep_alive),
        })
    }
}

/// Ollama's `keep_alive` (api/types.go `Duration.UnmarshalJSON`): a number
/// is seconds, a string is a Go duration (`"5m"`, `"1h30m"`, `"0"`); any
/// negative value means "stay loaded forever". Unreadable values are
/// ignored (Ollama would answer 400; the simulator keeps its default).
fn keep_alive(v: &serde_json::Value) -> Option<Option<Duration>> {
    let seconds = match v {
        serde_json::Value::Number(n) => n.as_f64()?,
        serde_json::Value::String(s) => go_duration_secs(s.trim())?,
        _ => return None,
    };
    if seconds < 0.0 {
        return Some(None);
    }
    Duration::try_from_secs_f64(seconds).ok().map(Some)
}

/// A Go duration string in seconds: `"300"` (bare number, as Ollama also
/// accepts), `"-1"`, or units `h`, `m`, `s`, `ms` chained (`"1h30m"`).
fn go_duration_secs(s: &str) -> Option<f64> {
    if let Ok(n) = s.parse::<f64>() {
        return Some(n);
    }
    let (sign, mut rest) = match s.strip_prefix('-') {
        Some(r) => (-1.0, r),
        None => (1.0, s),
    };
    let mut total = 0.0;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (0.001, 2)
        } else if rest.starts_with('h') {
            (3600.0, 1)
        } else if rest.starts_with('m') {
            (60.0, 1)
        } else if rest.starts_with('s') {
            (1.0, 1)
        } else {
            return None;
        };
        total += number * unit;
        rest = &rest[len..];
    }
    Some(sign * total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn no_headers_is_the_config() {
        let c = SimConfig::default();
        let p = Plan::new(&c, &HeaderMap::new()).unwrap();
        assert_eq!(p.ttft, c.ttft);
        assert_eq!(p.tokens_per_second, 50.0);
        assert_eq!((p.reasoning, p.answer), (0, 64));
        assert_eq!(
            (p.usage, p.server_timings, p.usage_factor),
            (false, false, 1.0)
        );
        assert_eq!(
            (p.status, p.cut_after, p.error_after, p.keepalive),
            (None, None, None, None)
        );
        assert_eq!(p.stop(), (64, Ending::Finish));
    }

    #[test]
    fn headers_override_everything() {
        let h = headers(&[
            (H_TTFT_MS, "50"),
            (H_TPS, "200"),
            (H_TOKENS, "20"),
            (H_REASONING, "5"),
            (H_USAGE, "true"),
            (H_SERVER_TIMINGS, "true"),
            (H_USAGE_FACTOR, "1.5"),
            (H_STATUS, "503"),
            (H_CUT_AFTER, "3"),
            (H_ERROR_AFTER, "4"),
            (H_KEEPALIVE_MS, "10"),
        ]);
        let p = Plan::new(&SimConfig::default(), &h).unwrap();
        assert_eq!(p.ttft, Duration::from_millis(50));
        assert_eq!(p.tokens_per_second, 200.0);
        assert_eq!((p.reasoning, p.answer, p.total()), (5, 20, 25));
        assert!(p.usage && p.server_timings);
        assert_eq!(p.usage_factor, 1.5);
        assert_eq!(p.status, Some(503));
        assert_eq!(p.keepalive, Some(Duration::from_millis(10)));
        assert_eq!(p.stop(), (3, Ending::Cut));
        assert_eq!(p.exact(25), 38); // 37.5 rounds half away from zero
    }

    #[test]
    fn a_stall_delays_every_token_after_it_and_pings_default_to_the_config() {
        let config = SimConfig {
            tokens_per_second: 10.0,
            ttft: Duration::from_millis(100),
            ping_interval: Some(Duration::from_millis(500)),
            ..SimConfig::default()
        };
        let h = headers(&[(H_STALL_AFTER, "3"), (H_STALL_MS, "5000")]);
        let p = Plan::new(&config, &h).unwrap();
        assert_eq!(p.keepalive, Some(Duration::from_millis(500)));
        let t0 = Instant::now();
        let ms = |i| (p.deadline(t0, i) - t0).as_millis();
        assert_eq!((ms(0), ms(1), ms(2)), (100, 200, 300));
        assert_eq!(
            (ms(3), ms(4)),
            (5_400, 5_500),
            "5 s of silence after 3 tokens"
        );
        assert_eq!(p.end(t0), p.deadline(t0, 63));
    }

    #[test]
    fn bad_overrides_name_the_header() {
        for (k, v) in [
            (H_TPS, "0"),
            (H_TPS, "fast"),
            (H_TOKENS, "-1"),
            (H_USAGE, "yes"),
            (H_USAGE_FACTOR, "-2"),
            (H_STATUS, "200"),
            (H_KEEPALIVE_MS, "0"),
        ] {
            let err = Plan::new(&SimConfig::default(), &headers(&[(k, v)])).unwrap_err();
            assert!(
                err.contains(k) || err.contains("override"),
                "{k}={v}: {err}"
            );
        }
    }

    #[test]
    fn deadlines_are_absolute_and_end_is_the_last_token() {
        let t0 = Instant::now();
        let h = headers(&[(H_TTFT_MS, "50"), (H_TPS, "200"), (H_TOKENS, "20")]);
        let p = Plan::new(&SimConfig::default(), &h).unwrap();
        assert_eq!(p.deadline(t0, 0), t0 + Duration::from_millis(50));
        assert_eq!(p.deadline(t0, 1), t0 + Duration::from_millis(55));
        assert_eq!(p.deadline(t0, 19), t0 + Duration::from_millis(145));
        assert_eq!(p.end(t0), t0 + Duration::from_millis(145));
        // 1/3 s steps do not drift: token 300 is exactly 100 s after token 0.
        let mut third = p.clone();
        third.tokens_per_second = 3.0;
        assert_eq!(
            third.deadline(t0, 300),
            third.deadline(t0, 0) + Duration::from_secs(100)
        );
        // No tokens: the end is the first-token time.
        let mut none = p;
        none.answer = 0;
        assert_eq!(none.end(t0), t0 + Duration::from_millis(50));
    }

    #[test]
    fn absurd_rates_clamp_instead_of_overflowing() {
        let t0 = Instant::now();
        let mut p = Plan::new(&SimConfig::default(), &HeaderMap::new()).unwrap();
        p.tokens_per_second = 1e-300;
        assert!(p.deadline(t0, 5) > t0 + Duration::from_secs(3600));
    }

    #[test]
    fn faults_beyond_the_output_never_fire_and_the_earlier_one_wins() {
        let mut p = Plan::new(&SimConfig::default(), &HeaderMap::new()).unwrap();
        p.answer = 10;
        p.cut_after = Some(11);
        assert_eq!(p.stop(), (10, Ending::Finish));
        p.cut_after = Some(10);
        assert_eq!(p.stop(), (10, Ending::Cut));
        p.error_after = Some(4);
        assert_eq!(p.stop(), (4, Ending::Error));
        p.error_after = Some(10);
        assert_eq!(p.stop(), (10, Ending::Cut));
        p.cut_after = None;
        p.error_after = Some(0);
        assert_eq!(p.stop(), (0, Ending::Error));
    }

    #[test]
    fn body_flags() {
        let f = BodyFlags::parse(
            br#"{"model":"qwen3","stream":true,"stream_options":{"include_usage":true}}"#,
            false,
        )
        .unwrap();
        assert!(f.stream && f.include_usage);
        assert_eq!(f.model, "qwen3");
        assert_eq!(f.prompt_tokens, 18); // 72 bytes / 4

        let f = BodyFlags::parse(b"", true).unwrap();
        assert!(f.stream && !f.include_usage);
        assert_eq!(f.model, DEFAULT_MODEL);
        assert_eq!(f.prompt_tokens, 1);

        let f = BodyFlags::parse(br#"{"stream":"yes","model":""}"#, false).unwrap();
        assert!(!f.stream);
        assert_eq!(f.model, DEFAULT_MODEL);

        assert!(BodyFlags::parse(b"{", false).is_err());
        assert!(BodyFlags::parse(b"[1]", false).is_err());
    }
}
