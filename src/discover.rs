//! Auto-discovery of local LLM servers: what `speedtap run` routes when no
//! route was configured.
//!
//! Each candidate port on the loopback interface is probed concurrently with
//! a few cheap `GET`s of the endpoints that tell servers apart
//! (`docs/protocols.md` "Default ports and discovery"). Several servers share defaults (llama.cpp,
//! LocalAI and a published TGI container all use 8080), so the port only
//! says where to look; the answers say what is there. Only JSON answers
//! count: a web app that serves the same HTML page for every path is not
//! mistaken for anything.
//!
//! Only loopback is ever probed: discovery must not scan a network.
//!
//! Which listeners deserve a probe at all comes from the machine itself:
//! [`listeners`] reads the kernel's table of listening sockets and says
//! what changed, [`owner`] finds the process behind a socket, and
//! [`known`] decides from the process and the port whether to ask, and
//! [`registry`] keeps each server found under a name that never changes.

pub mod known;
pub mod listeners;
pub mod owner;
pub mod peer;
pub mod registry;

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpStream;

use crate::model::route::CaptureOnlyRoute;
use crate::model::{RouteDoc, RouteSpec, ServerDoc, Upstream};

/// The usual ports, in the order `docs/protocols.md` lists them: Ollama, llama.cpp (also LocalAI
/// and TGI containers), LM Studio, vLLM, KoboldCpp, Jan.
pub const DEFAULT_PORTS: [u16; 6] = [11434, 8080, 1234, 8000, 5001, 1337];

/// Connecting to a loopback port either works at once or is refused; this
/// only matters for a port swallowed by a firewall rule.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(300);

/// The whole budget per port in [`discover`]: connect plus every probe.
pub const PORT_BUDGET: Duration = Duration::from_millis(1000);

/// Largest probe answer read: LM Studio's model list or llama.cpp's `/props`
/// (with its chat template) are a few KiB; anything past this is not a
/// discovery answer.
const MAX_BODY: usize = 1 << 20;

/// What kind of server answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ServerKind {
    Ollama,
    LlamaCpp,
    LmStudio,
    Vllm,
    KoboldCpp,
    Jan,
    LocalAi,
    Tgi,
    /// Serves an OpenAI-style `/v1/models` and nothing more specific.
    OpenAiCompatible,
}

impl ServerKind {
    /// The product name, for people.
    pub fn label(self) -> &'static str {
        crate::model::product_name(self.slug()).unwrap_or("OpenAI-compatible server")
    }

    /// The slug a followed server of this kind is known by: the same as
    /// its process's ([`known::ProcessKind::slug`]), so a server is the
    /// same server whether its owner could be read or only its answers.
    pub fn slug(self) -> &'static str {
        match self {
            ServerKind::Ollama => "ollama",
            ServerKind::LlamaCpp => "llama-server",
            ServerKind::LmStudio => "lm-studio",
            ServerKind::Vllm => "vllm",
            ServerKind::KoboldCpp => "koboldcpp",
            ServerKind::Jan => "jan",
            ServerKind::LocalAi => "local-ai",
            ServerKind::Tgi => "tgi",
            ServerKind::OpenAiCompatible => "openai",
        }
    }

    /// The port the kind listens on by default, where it has one (see
    /// [`known::ProcessKind::default_port`]).
    pub fn default_port(self) -> Option<u16> {
        match self {
            ServerKind::Ollama => Some(11434),
            ServerKind::LlamaCpp | ServerKind::LocalAi => Some(8080),
            ServerKind::LmStudio => Some(1234),
            ServerKind::Vllm => Some(8000),
            ServerKind::KoboldCpp => Some(5001),
            ServerKind::Jan => Some(1337),
            ServerKind::Tgi | ServerKind::OpenAiCompatible => None,
        }
    }

    /// Its `gen_ai.provider.name` in the metrics: the conventions list no
    /// local server among their well-known values (`openai`,
    /// `anthropic`...) and allow a custom one, so each kind is named
    /// after itself, lowercase. A server that only showed an OpenAI-style
    /// model list is not identified: `None`.
    pub fn provider_name(self) -> Option<&'static str> {
        match self {
            ServerKind::Ollama => Some("ollama"),
            ServerKind::LlamaCpp => Some("llama.cpp"),
            ServerKind::LmStudio => Some("lm_studio"),
            ServerKind::Vllm => Some("vllm"),
            ServerKind::KoboldCpp => Some("koboldcpp"),
            ServerKind::Jan => Some("jan"),
            ServerKind::LocalAi => Some("localai"),
            ServerKind::Tgi => Some("tgi"),
            ServerKind::OpenAiCompatible => None,
        }
    }

    /// The suggested route name: short, lowercase, valid as a route name.
    pub fn route_name(self) -> &'static str {
        match self {
            ServerKind::Ollama => "ollama",
            ServerKind::LlamaCpp => "llamacpp",
            ServerKind::LmStudio => "lmstudio",
            ServerKind::Vllm => "vllm",
            ServerKind::KoboldCpp => "koboldcpp",
            ServerKind::Jan => "jan",
            ServerKind::LocalAi => "localai",
            ServerKind::Tgi => "tgi",
            ServerKind::OpenAiCompatible => "openai",
        }
    }
}

/// One server found.
#[derive(Clone, Debug, PartialEq)]
pub struct Discovered {
    pub kind: ServerKind,
    pub port: u16,
    /// `http://127.0.0.1:PORT`.
    pub upstream: String,
    /// Named after the kind (`ollama`; `ollama-11500` for a second one),
    /// listening on the same host at port + 1 (port 0, "any free port", for
    /// a server on 65535).
    pub suggested_route: RouteSpec,
    /// Version or model, when a probe answer carried it.
    pub detail: Option<String>,
}

impl Discovered {
    /// One line for the start-up message, e.g.
    /// `Ollama (version 0.12.3) at http://127.0.0.1:11434 -> route "ollama" on 127.0.0.1:11435`.
    pub fn summary(&self) -> String {
        format!("{} on {}", self.found(), self.suggested_route.listen)
    }

    /// What both summaries start with: the server, where it is, its route.
    fn found(&self) -> String {
        let detail = self
            .detail
            .as_deref()
            .map(|d| format!(" ({d})"))
            .unwrap_or_default();
        format!(
            "{}{detail} at {} -> route {:?}",
            self.kind.label(),
            self.upstream,
            self.suggested_route.name
        )
    }

    /// The route that measures this server by capture alone (no proxy
    /// port): named like [`Discovered::suggested_route`], upstream the
    /// server itself.
    pub fn capture_route(&self) -> CaptureOnlyRoute {
        CaptureOnlyRoute {
            name: self.suggested_route.name.clone(),
            upstream: self.suggested_route.upstream.clone(),
        }
    }

    /// One line for the start-up message when the server is captured, e.g.
    /// `Ollama (version 0.12.3) at http://127.0.0.1:11434 -> route "ollama", captured (no client changes)`.
    pub fn capture_summary(&self) -> String {
        format!("{}, captured (no client changes)", self.found())
    }
}

/// Probes 127.0.0.1 on [`DEFAULT_PORTS`], each within [`PORT_BUDGET`].
/// Returns the servers found, in port order.
pub async fn discover() -> Vec<Discovered> {
    discover_on(IpAddr::V4(Ipv4Addr::LOCALHOST), &DEFAULT_PORTS, PORT_BUDGET).await
}

/// Probes `ports` on `host` concurrently; `timeout` bounds each port's whole
/// identification (connect and probes), so the call returns within about
/// `timeout`. A non-loopback `host` is refused (nothing is probed). Returns
/// the servers found, in port order.
pub async fn discover_on(host: IpAddr, ports: &[u16], timeout: Duration) -> Vec<Discovered> {
    if !host.is_loopback() {
        tracing::warn!(%host, "discovery only probes loopback addresses; skipped");
        return Vec::new();
    }
    let mut ports = ports.to_vec();
    ports.sort_unstable();
    ports.dedup();
    let connect_timeout = timeout.min(CONNECT_TIMEOUT);
    let probes = ports.iter().map(|&port| async move {
        let addr = SocketAddr::new(host, port);
        let found = tokio::time::timeout(timeout, probe_port(addr, connect_timeout))
            .await
            .ok()
            .flatten();
        found.map(|(kind, detail)| (port, kind, detail))
    });
    let found = futures_util::future::join_all(probes).await;

    let mut out: Vec<Discovered> = Vec::new();
    for (port, kind, detail) in found.into_iter().flatten() {
        let base = kind.route_name();
        let name = if out.iter().any(|d| d.suggested_route.name == base) {
            format!("{base}-{port}")
        } else {
            base.to_string()
        };
        let upstream = Upstream {
            host: host.to_string(),
            port,
            base_path: String::new(),
        };
        out.push(Discovered {
            kind,
            port,
            upstream: upstream.base_url(),
            suggested_route: RouteSpec {
                name,
                listen: SocketAddr::new(host, port.checked_add(1).unwrap_or(0)),
                upstream,
            },
            detail,
        });
    }
    out
}

/// One probe's answer: the status and the body if it was JSON.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Reply {
    status: u16,
    json: Option<Value>,
}

impl Reply {
    /// The JSON body of a 200 answer.
    fn ok_json(&self) -> Option<&Value> {
        (self.status == 200).then_some(self.json.as_ref()).flatten()
    }
}

async fn probe_port(
    addr: SocketAddr,
    connect_timeout: Duration,
) -> Option<(ServerKind, Option<String>)> {
    // Nothing listening is the common case: find out with one connect.
    tokio::time::timeout(connect_timeout, TcpStream::connect(addr))
        .await
        .ok()?
        .ok()?;
    identify(addr.port(), |path| get(addr, path, connect_timeout)).await
}

/// One `GET` on a fresh connection (servers differ in keep-alive habits; a
/// loopback connect costs nothing). `None` on any transport failure.
async fn get(addr: SocketAddr, path: &'static str, connect_timeout: Duration) -> Option<Reply> {
    let stream = tokio::time::timeout(connect_timeout, TcpStream::connect(addr))
        .await
        .ok()?
        .ok()?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    let request = http::Request::get(path)
        .header(http::header::HOST, addr.to_string())
        .header(http::header::ACCEPT, "application/json")
        .header(
            http::header::USER_AGENT,
            concat!("speedtap/", env!("CARGO_PKG_VERSION")),
        )
        .body(Empty::<Bytes>::new())
        .ok()?;
    let reply = async {
        let response = sender.send_request(request).await.ok()?;
        let status = response.status().as_u16();
        let body = Limited::new(response.into_body(), MAX_BODY)
            .collect()
            .await
            .ok()?
            .to_bytes();
        Some(Reply {
            status,
            json: serde_json::from_slice(&body).ok(),
        })
    }
    .await;
    driver.abort();
    reply
}

/// The `id`s of an OpenAI-style model list (`{"data": [{"id": ...}]}`), or
/// `None` when the answer isn't one.
fn model_list(v: &Value) -> Option<&Vec<Value>> {
    v.get("data")?.as_array()
}

fn first_model_id(models: &[Value]) -> Option<String> {
    models
        .iter()
        .find_map(|m| m.get("id")?.as_str())
        .map(str::to_string)
}

fn owned_by(models: &[Value], owner: &str) -> bool {
    models
        .iter()
        .any(|m| m.get("owned_by").and_then(Value::as_str) == Some(owner))
}

fn str_field(v: &Value, key: &str) -> Option<String> {
    v.get(key)?
        .as_str()
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// Decides what answers on `port`, asking `get` for probe paths in an order
/// that resolves the shared defaults: the endpoints only one product serves
/// first, the generic OpenAI model list last.
///
/// - KoboldCpp before Ollama: newer KoboldCpp emulates parts of Ollama's API.
/// - llama.cpp answers 503 "Loading model" on every path while loading; that
///   still identifies it.
/// - Jan has no endpoint of its own and wants an API key, so on its default
///   port (1337) an OpenAI model list, or a 401/403 for it, means Jan.
/// - LocalAI's `/readyz` only counts next to a real model list, because a
///   catch-all web server also answers 200 there.
pub(crate) async fn identify<F, Fut>(port: u16, get: F) -> Option<Identified>
where
    F: Fn(&'static str) -> Fut,
    Fut: Future<Output = Option<Reply>>,
{
    if let Some(found) = get("/api/extra/version")
        .await
        .as_ref()
        .and_then(Reply::ok_json)
        .and_then(koboldcpp)
    {
        return Some(found);
    }
    if let Some(found) = get("/api/version")
        .await
        .as_ref()
        .and_then(Reply::ok_json)
        .and_then(ollama)
    {
        return Some(found);
    }
    if let Some(found) = get("/props").await.as_ref().and_then(llamacpp) {
        return Some(found);
    }
    if let Some(found) = get("/info")
        .await
        .as_ref()
        .and_then(Reply::ok_json)
        .and_then(tgi)
    {
        return Some(found);
    }
    if let Some(found) = get("/api/v0/models")
        .await
        .as_ref()
        .and_then(Reply::ok_json)
        .and_then(lm_studio)
    {
        return Some(found);
    }
    openai_server(port, &get).await
}

/// What [`identify`] finds: the kind and a detail for people (a model or
/// a version).
type Identified = (ServerKind, Option<String>);

/// `/api/extra/version` naming KoboldCpp.
fn koboldcpp(v: &Value) -> Option<Identified> {
    let result = str_field(v, "result").unwrap_or_default();
    result.to_ascii_lowercase().contains("kobold").then(|| {
        (
            ServerKind::KoboldCpp,
            str_field(v, "version").map(|x| format!("version {x}")),
        )
    })
}

/// Ollama's `/api/version`.
fn ollama(v: &Value) -> Option<Identified> {
    let version = str_field(v, "version")?;
    Some((ServerKind::Ollama, Some(format!("version {version}"))))
}

/// llama.cpp's `/props`, or its 503 "Loading model" answer.
fn llamacpp(reply: &Reply) -> Option<Identified> {
    if let Some(v) = reply.ok_json() {
        const KEYS: [&str; 4] = [
            "build_info",
            "model_path",
            "total_slots",
            "default_generation_settings",
        ];
        if KEYS.iter().any(|k| v.get(k).is_some()) {
            let model = str_field(v, "model_path")
                .map(|p| p.rsplit(['/', '\\']).next().unwrap_or(&p).to_string());
            return Some((
                ServerKind::LlamaCpp,
                model.or_else(|| str_field(v, "build_info")),
            ));
        }
    }
    let loading = reply.status == 503
        && reply
            .json
            .as_ref()
            .and_then(|v| v.pointer("/error/message"))
            .and_then(Value::as_str)
            .is_some_and(|m| m.contains("Loading model"));
    loading.then(|| (ServerKind::LlamaCpp, Some("loading model".into())))
}

/// TGI's `/info`.
fn tgi(v: &Value) -> Option<Identified> {
    let model = str_field(v, "model_id")?;
    Some((ServerKind::Tgi, Some(model)))
}

/// LM Studio's `/api/v0/models`, with the loaded model.
fn lm_studio(v: &Value) -> Option<Identified> {
    let models = model_list(v)?;
    let loaded = models
        .iter()
        .find(|m| m.get("state").and_then(Value::as_str) == Some("loaded"))
        .and_then(|m| str_field(m, "id"));
    Some((
        ServerKind::LmStudio,
        Some(loaded.unwrap_or_else(|| "no model loaded".into())),
    ))
}

/// The generic OpenAI model list, last: who owns the models tells vLLM,
/// llama.cpp and KoboldCpp; the port tells Jan (even locked); `/readyz`
/// tells LocalAI.
async fn openai_server<F, Fut>(port: u16, get: &F) -> Option<Identified>
where
    F: Fn(&'static str) -> Fut,
    Fut: Future<Output = Option<Reply>>,
{
    let models_reply = get("/v1/models").await;
    let models = models_reply
        .as_ref()
        .and_then(Reply::ok_json)
        .and_then(model_list);
    if let Some(models) = models {
        if owned_by(models, "vllm") {
            let version = get("/version").await;
            let version = version
                .as_ref()
                .and_then(Reply::ok_json)
                .and_then(|v| str_field(v, "version"));
            let detail = first_model_id(models).or(version.map(|v| format!("version {v}")));
            return Some((ServerKind::Vllm, detail));
        }
        if owned_by(models, "llamacpp") {
            return Some((ServerKind::LlamaCpp, first_model_id(models)));
        }
        if owned_by(models, "koboldcpp") {
            return Some((ServerKind::KoboldCpp, first_model_id(models)));
        }
        if port == 1337 {
            return Some((ServerKind::Jan, first_model_id(models)));
        }
        if get("/readyz").await.is_some_and(|r| r.status == 200) {
            return Some((ServerKind::LocalAi, first_model_id(models)));
        }
        return Some((ServerKind::OpenAiCompatible, first_model_id(models)));
    }
    let locked = models_reply.is_some_and(|r| r.status == 401 || r.status == 403);
    if port == 1337 && locked {
        return Some((ServerKind::Jan, Some("needs its API key".into())));
    }
    None
}

impl From<&Discovered> for ServerDoc {
    fn from(d: &Discovered) -> Self {
        ServerDoc {
            kind: format!("{:?}", d.kind).to_lowercase(),
            label: d.kind.label().to_owned(),
            port: d.port,
            upstream: d.upstream.clone(),
            detail: d.detail.clone(),
            suggested_route: RouteDoc::from(&d.suggested_route),
            proxy_url: format!("http://{}", d.suggested_route.listen),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    // ---- identify() over canned answers ---------------------------------

    fn answers(pairs: &[(&'static str, u16, &str)]) -> HashMap<&'static str, Reply> {
        pairs
            .iter()
            .map(|&(path, status, body)| {
                (
                    path,
                    Reply {
                        status,
                        json: serde_json::from_str(body).ok(),
                    },
                )
            })
            .collect()
    }

    async fn identify_with(
        port: u16,
        map: &HashMap<&'static str, Reply>,
    ) -> Option<(ServerKind, Option<String>)> {
        identify(port, |path| std::future::ready(map.get(path).cloned())).await
    }

    #[tokio::test]
    #[allow(
        clippy::too_many_lines,
        reason = "one scripted answer per kind, read top to bottom"
    )]
    async fn each_kind_is_told_apart_by_its_own_endpoint() {
        let cases: Vec<(u16, HashMap<_, _>, ServerKind, Option<&str>)> = vec![
            (
                11434,
                answers(&[
                    ("/api/version", 200, r#"{"version":"0.12.3"}"#),
                    ("/v1/models", 200, r#"{"data":[]}"#),
                ]),
                ServerKind::Ollama,
                Some("version 0.12.3"),
            ),
            (
                5001,
                answers(&[
                    (
                        "/api/extra/version",
                        200,
                        r#"{"result":"KoboldCpp","version":"1.80"}"#,
                    ),
                    ("/api/version", 200, r#"{"version":"0.0.0"}"#),
                ]),
                ServerKind::KoboldCpp,
                Some("version 1.80"),
            ),
            (
                8080,
                answers(&[(
                    "/props",
                    200,
                    r#"{"model_path":"/m/qwen3-8b.Q4.gguf","total_slots":1}"#,
                )]),
                ServerKind::LlamaCpp,
                Some("qwen3-8b.Q4.gguf"),
            ),
            (
                8080,
                answers(&[(
                    "/props",
                    503,
                    r#"{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}"#,
                )]),
                ServerKind::LlamaCpp,
                Some("loading model"),
            ),
            (
                8080,
                answers(&[(
                    "/info",
                    200,
                    r#"{"model_id":"HuggingFaceH4/zephyr-7b-beta","version":"3.0.0"}"#,
                )]),
                ServerKind::Tgi,
                Some("HuggingFaceH4/zephyr-7b-beta"),
            ),
            (
                1234,
                answers(&[(
                    "/api/v0/models",
                    200,
                    r#"{"object":"list","data":[{"id":"a","state":"not-loaded"},{"id":"qwen3-8b","state":"loaded"}]}"#,
                )]),
                ServerKind::LmStudio,
                Some("qwen3-8b"),
            ),
            (
                8000,
                answers(&[
                    (
                        "/v1/models",
                        200,
                        r#"{"data":[{"id":"Qwen/Qwen3-8B","owned_by":"vllm"}]}"#,
                    ),
                    ("/version", 200, r#"{"version":"0.9.0"}"#),
                ]),
                ServerKind::Vllm,
                Some("Qwen/Qwen3-8B"),
            ),
            (
                8080,
                answers(&[
                    ("/readyz", 200, ""),
                    (
                        "/v1/models",
                        200,
                        r#"{"object":"list","data":[{"id":"phi-2","object":"model"}]}"#,
                    ),
                ]),
                ServerKind::LocalAi,
                Some("phi-2"),
            ),
            (
                1337,
                answers(&[("/v1/models", 401, r#"{"error":"unauthorized"}"#)]),
                ServerKind::Jan,
                Some("needs its API key"),
            ),
            (
                1337,
                answers(&[("/v1/models", 200, r#"{"data":[{"id":"llama3.2-3b"}]}"#)]),
                ServerKind::Jan,
                Some("llama3.2-3b"),
            ),
            (
                9999,
                answers(&[("/v1/models", 200, r#"{"data":[{"id":"m"}]}"#)]),
                ServerKind::OpenAiCompatible,
                Some("m"),
            ),
        ];
        for (port, map, kind, detail) in cases {
            let got = identify_with(port, &map).await;
            assert_eq!(
                got,
                Some((kind, detail.map(str::to_string))),
                "{kind:?} on {port}"
            );
        }
    }

    #[tokio::test]
    async fn non_llm_answers_identify_nothing() {
        // A catch-all JSON API, a 401 away from Jan's port, and an SPA page.
        for (port, map) in [
            (
                8080,
                answers(&[
                    ("/api/version", 200, "{}"),
                    ("/props", 200, "{}"),
                    ("/v1/models", 200, "{}"),
                ]),
            ),
            (8000, answers(&[("/v1/models", 401, "{}")])),
            (
                8080,
                answers(&[("/readyz", 200, "<html>"), ("/v1/models", 200, "<html>")]),
            ),
        ] {
            assert_eq!(identify_with(port, &map).await, None);
        }
    }

    // ---- discover_on() against live fake servers ------------------------

    type Handler = fn(&str) -> (u16, String);

    /// A one-request-per-connection HTTP/1.1 server on 127.0.0.1:0.
    async fn fake_server(handler: Handler) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            loop {
                let Ok((mut sock, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&buf);
                    let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
                    let (status, body) = handler(&path);
                    let response = format!(
                        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = sock.write_all(response.as_bytes()).await;
                    let _ = sock.shutdown().await;
                });
            }
        });
        port
    }

    fn ollama(path: &str) -> (u16, String) {
        match path {
            "/" => (200, "Ollama is running".into()),
            "/api/version" => (200, r#"{"version":"0.12.3"}"#.into()),
            "/v1/models" => (
                200,
                r#"{"object":"list","data":[{"id":"qwen3:8b","owned_by":"library"}]}"#.into(),
            ),
            _ => (404, "404 page not found".into()),
        }
    }

    fn llama_cpp(path: &str) -> (u16, String) {
        match path {
            "/health" => (200, r#"{"status":"ok"}"#.into()),
            "/props" => (
                200,
                r#"{"build_info":"b6000-abc","model_path":"/models/qwen.gguf","total_slots":1}"#
                    .into(),
            ),
            "/v1/models" => (
                200,
                r#"{"object":"list","data":[{"id":"qwen","owned_by":"llamacpp"}]}"#.into(),
            ),
            _ => (
                404,
                r#"{"error":{"code":404,"message":"File Not Found","type":"not_found_error"}}"#
                    .into(),
            ),
        }
    }

    /// A web app that answers every path with the same page.
    fn not_llm(_: &str) -> (u16, String) {
        (200, "<!doctype html><title>my app</title>".into())
    }

    #[tokio::test]
    async fn discover_on_finds_and_identifies_exactly_the_llm_servers() {
        let o = fake_server(ollama).await;
        let l = fake_server(llama_cpp).await;
        let other = fake_server(not_llm).await;
        let closed = {
            let probe = TcpListener::bind("127.0.0.1:0").await.unwrap();
            probe.local_addr().unwrap().port()
        };
        let host = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let found = discover_on(host, &[other, l, closed, o], Duration::from_secs(5)).await;

        let mut expected = vec![(o, ServerKind::Ollama), (l, ServerKind::LlamaCpp)];
        expected.sort_by_key(|e| e.0);
        let got: Vec<(u16, ServerKind)> = found.iter().map(|d| (d.port, d.kind)).collect();
        assert_eq!(got, expected, "{found:#?}");

        for d in &found {
            assert_eq!(d.upstream, format!("http://127.0.0.1:{}", d.port));
            assert_eq!(d.suggested_route.listen, SocketAddr::new(host, d.port + 1));
            assert_eq!(d.suggested_route.upstream.base_url(), d.upstream);
            let (name, detail) = match d.kind {
                ServerKind::Ollama => ("ollama", "version 0.12.3"),
                _ => ("llamacpp", "qwen.gguf"),
            };
            assert_eq!(d.suggested_route.name, name);
            assert_eq!(d.detail.as_deref(), Some(detail));
        }
        let ollama_found = found.iter().find(|d| d.kind == ServerKind::Ollama).unwrap();
        assert_eq!(
            ollama_found.summary(),
            format!("Ollama (version 0.12.3) at http://127.0.0.1:{o} -> route \"ollama\" on 127.0.0.1:{}", o + 1)
        );
    }

    #[tokio::test]
    async fn a_second_server_of_a_kind_gets_a_port_suffixed_name() {
        let a = fake_server(ollama).await;
        let b = fake_server(ollama).await;
        let found = discover_on(
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            &[a, b],
            Duration::from_secs(5),
        )
        .await;
        let (lo, hi) = (a.min(b), a.max(b));
        let names: Vec<&str> = found
            .iter()
            .map(|d| d.suggested_route.name.as_str())
            .collect();
        assert_eq!(names, ["ollama".to_string(), format!("ollama-{hi}")]);
        assert_eq!(found[0].port, lo);
    }

    #[tokio::test]
    async fn only_loopback_is_probed() {
        let o = fake_server(ollama).await;
        let lan = IpAddr::V4(Ipv4Addr::new(192, 168, 1, 1));
        assert!(discover_on(lan, &[o], Duration::from_secs(1))
            .await
            .is_empty());
        let wildcard = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
        assert!(discover_on(wildcard, &[o], Duration::from_secs(1))
            .await
            .is_empty());
    }

    #[test]
    fn route_names_are_valid_route_names() {
        for k in [
            ServerKind::Ollama,
            ServerKind::LlamaCpp,
            ServerKind::LmStudio,
            ServerKind::Vllm,
            ServerKind::KoboldCpp,
            ServerKind::Jan,
            ServerKind::LocalAi,
            ServerKind::Tgi,
            ServerKind::OpenAiCompatible,
        ] {
            let flag = format!("{}=127.0.0.1:1=http://127.0.0.1:2", k.route_name());
            assert!(crate::config::parse_route_flag(&flag).is_ok(), "{k:?}");
        }
    }
}
