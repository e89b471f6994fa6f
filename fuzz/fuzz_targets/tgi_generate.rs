//! `ApiKind::TgiGenerate` response bodies through the public `StreamDecoder`
//! (SSE, NDJSON or JSON framing chosen by the input's flags byte): never
//! panics, same events whole or split, event-level promises hold. See
//! `speedtap_fuzz::protocol_target`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use speedtap_fuzz::model::ApiKind;

fuzz_target!(|data: &[u8]| speedtap_fuzz::protocol_target(ApiKind::TgiGenerate, data));
