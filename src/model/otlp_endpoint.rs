//! The OTLP collector endpoint's one validation, shared by the config
//! file, the flags and the exporter, so every front end refuses the same
//! endpoints with the same words before anything starts.

/// `http://collector:4318` -> `http://collector:4318/v1/metrics`. An
/// endpoint that already ends in `/v1/metrics` is kept as it is; a base path
/// is kept (`http://gw/otlp` -> `http://gw/otlp/v1/metrics`), as the OTLP
/// exporter spec does for `OTEL_EXPORTER_OTLP_ENDPOINT`.
pub fn otlp_metrics_url(endpoint: &str) -> Result<String, String> {
    let e = endpoint.trim();
    let lower = e.to_ascii_lowercase();
    if lower.starts_with("https://") {
        return Err(format!(
            "OTLP endpoint {e:?}: https is not supported (speedtap has no TLS stack); \
             send to a local or private-network collector over http://"
        ));
    }
    if !lower.starts_with("http://") {
        return Err(format!(
            "OTLP endpoint {e:?} is not an http:// URL (e.g. http://collector:4318)"
        ));
    }
    let base = e.trim_end_matches('/');
    let url = if base.ends_with("/v1/metrics") {
        base.to_owned()
    } else {
        format!("{base}/v1/metrics")
    };
    let uri: http::Uri = url
        .parse()
        .map_err(|err| format!("OTLP endpoint {e:?}: {err}"))?;
    if uri.host().is_none_or(str::is_empty) || uri.query().is_some() {
        return Err(format!(
            "OTLP endpoint {e:?}: expected http://HOST[:PORT][/PATH]"
        ));
    }
    Ok(url)
}
