//! The config parser (`speedtap_fuzz::config`): the TOML file and the small
//! parsers behind it and behind `--route` (upstream URL, listen address).
//! The payload is the file's text (non-UTF-8 payloads are skipped: the
//! file is read with `read_to_string`, which rejects them first).
//!
//! Checks: never panics; an error names a line inside the file; a parsed
//! file survives `to_toml` (what the tray saves) and parses back equal;
//! `resolve` with no flags never panics; an upstream or listen address
//! that parses prints back to a string that parses to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use speedtap_fuzz::config::{parse_config, parse_listen, parse_route_flag, resolve, CliOverrides};
use speedtap_fuzz::model::Upstream;
use speedtap_fuzz::Input;

fuzz_target!(|data: &[u8]| {
    let input = Input::parse(data);
    let Ok(text) = std::str::from_utf8(input.payload) else {
        return;
    };
    match parse_config(text, "fuzz.toml") {
        Err(e) => {
            if let Some(line) = e.line() {
                let lines = text.bytes().filter(|&b| b == b'\n').count() + 1;
                assert!((1..=lines).contains(&line), "error line {line} of {lines}");
            }
            let _ = e.to_string();
        }
        Ok(file) => {
            let saved = file.to_toml();
            match parse_config(&saved, "saved.toml") {
                Ok(again) => assert_eq!(again, file, "to_toml round trip"),
                Err(e) => panic!("to_toml wrote a file that does not parse: {e}"),
            }
            let _ = resolve(Some(file), CliOverrides::default());
        }
    }

    // The same text through the single-value parsers, line by line (a
    // line is what a user types after `--route` or `upstream =`).
    for line in text.lines().take(16) {
        if let Ok(u) = Upstream::parse(line) {
            assert_eq!(Upstream::parse(&u.base_url()), Ok(u), "upstream round trip");
        }
        if let Ok(a) = parse_listen(line) {
            assert_eq!(parse_listen(&a.to_string()), Ok(a), "listen round trip");
        }
        let _ = parse_route_flag(line);
    }
});
