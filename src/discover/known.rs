//! Which new listeners are worth asking "are you a model server?": the
//! well-known ports, the processes that are model servers by name, and
//! the ports the user names. Every other listener is a stranger and is
//! never probed, so watching the machine never pokes a database, a web
//! app or a game that happens to listen on loopback.
//!
//! A process is matched by its `comm`, the base name of its executable,
//! and its command line: a console script shows its own name (`vllm`),
//! while `python -m sglang.launch_server` or `python koboldcpp.py` show
//! the interpreter, so the module or script named on the command line
//! counts too. A llama-server started by Ollama (its runner, on a port the
//! system picked) is part of Ollama, never a server of its own: its calls
//! are Ollama's calls, measured on Ollama's port.

use std::path::Path;

use super::owner::Owner;

/// A model server (or relay) known by its process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProcessKind {
    Ollama,
    LlamaServer,
    LmStudio,
    Vllm,
    Sglang,
    KoboldCpp,
    Jan,
    Llamafile,
    LocalAi,
    TabbyApi,
    TextGenerationWebui,
    Aphrodite,
    LlamaSwap,
    LiteLlm,
    MlxLm,
    /// `speedtap simulate`: the scripted server of demos and tests.
    SpeedtapSimulate,
}

/// The names each kind goes by, lowercase: matched against the process
/// name, the executable's base name, and the command line's scripts and
/// modules (see [`names_of`]).
const KNOWN_NAMES: &[(ProcessKind, &[&str])] = &[
    (ProcessKind::Ollama, &["ollama"]),
    (ProcessKind::LlamaServer, &["llama-server"]),
    (
        ProcessKind::LmStudio,
        &["lm studio", "lm-studio", "lmstudio", "lms", "llmster"],
    ),
    (
        ProcessKind::Vllm,
        &["vllm", "vllm.entrypoints.openai.api_server"],
    ),
    (ProcessKind::Sglang, &["sglang.launch_server", "sglang"]),
    (ProcessKind::KoboldCpp, &["koboldcpp", "koboldcpp.py"]),
    (ProcessKind::Jan, &["jan"]),
    (ProcessKind::Llamafile, &["llamafile"]),
    (ProcessKind::LocalAi, &["local-ai", "localai"]),
    (ProcessKind::TabbyApi, &["tabbyapi"]),
    (ProcessKind::TextGenerationWebui, &["text-generation-webui"]),
    (ProcessKind::Aphrodite, &["aphrodite"]),
    (ProcessKind::LlamaSwap, &["llama-swap"]),
    (ProcessKind::LiteLlm, &["litellm"]),
    (ProcessKind::MlxLm, &["mlx_lm.server", "mlx_lm"]),
];

/// Ports model servers listen on by default (or by common choice), each
/// probed whoever owns it: Ollama, llama.cpp's old and new default (8080
/// is also LocalAI's, llamafile's, llama-swap's and mlx_lm's), LM Studio,
/// vLLM and its usual second port, KoboldCpp, Jan, SGLang, TabbyAPI and
/// text-generation-webui, Aphrodite, LiteLLM.
pub const WELL_KNOWN_PORTS: [u16; 12] = [
    11434, 8080, 9931, 1234, 8000, 8001, 5001, 1337, 30000, 5000, 2242, 4000,
];

impl ProcessKind {
    /// The stable slug route names are made of (`llama-server`,
    /// `lm-studio`...).
    pub fn slug(self) -> &'static str {
        match self {
            ProcessKind::Ollama => "ollama",
            ProcessKind::LlamaServer => "llama-server",
            ProcessKind::LmStudio => "lm-studio",
            ProcessKind::Vllm => "vllm",
            ProcessKind::Sglang => "sglang",
            ProcessKind::KoboldCpp => "koboldcpp",
            ProcessKind::Jan => "jan",
            ProcessKind::Llamafile => "llamafile",
            ProcessKind::LocalAi => "local-ai",
            ProcessKind::TabbyApi => "tabbyapi",
            ProcessKind::TextGenerationWebui => "text-generation-webui",
            ProcessKind::Aphrodite => "aphrodite",
            ProcessKind::LlamaSwap => "llama-swap",
            ProcessKind::LiteLlm => "litellm",
            ProcessKind::MlxLm => "mlx-lm",
            ProcessKind::SpeedtapSimulate => "simulate",
        }
    }

    /// The port the kind listens on when not told otherwise, where it has
    /// one: a server there is named by its kind alone.
    pub fn default_port(self) -> Option<u16> {
        match self {
            ProcessKind::Ollama => Some(11434),
            ProcessKind::LlamaServer
            | ProcessKind::Llamafile
            | ProcessKind::LocalAi
            | ProcessKind::LlamaSwap
            | ProcessKind::MlxLm => Some(8080),
            ProcessKind::LmStudio => Some(1234),
            ProcessKind::Vllm => Some(8000),
            ProcessKind::Sglang => Some(30000),
            ProcessKind::KoboldCpp => Some(5001),
            ProcessKind::Jan => Some(1337),
            ProcessKind::TabbyApi | ProcessKind::TextGenerationWebui => Some(5000),
            ProcessKind::Aphrodite => Some(2242),
            ProcessKind::LiteLlm => Some(4000),
            ProcessKind::SpeedtapSimulate => None,
        }
    }

    /// Its `gen_ai.provider.name` in the metrics, named like
    /// [`ServerKind::provider_name`](super::ServerKind::provider_name)
    /// (`llama.cpp`, `lm_studio`...). `speedtap simulate` is no server of
    /// its own: `None`, and the kind it answers as names it.
    pub fn provider_name(self) -> Option<&'static str> {
        Some(match self {
            ProcessKind::Ollama => "ollama",
            ProcessKind::LlamaServer => "llama.cpp",
            ProcessKind::LmStudio => "lm_studio",
            ProcessKind::Vllm => "vllm",
            ProcessKind::Sglang => "sglang",
            ProcessKind::KoboldCpp => "koboldcpp",
            ProcessKind::Jan => "jan",
            ProcessKind::Llamafile => "llamafile",
            ProcessKind::LocalAi => "localai",
            ProcessKind::TabbyApi => "tabbyapi",
            ProcessKind::TextGenerationWebui => "text_generation_webui",
            ProcessKind::Aphrodite => "aphrodite",
            ProcessKind::LlamaSwap => "llama_swap",
            ProcessKind::LiteLlm => "litellm",
            ProcessKind::MlxLm => "mlx_lm",
            ProcessKind::SpeedtapSimulate => return None,
        })
    }

    /// Relays forward their clients' calls to other model servers: a call
    /// through one would be seen twice if both sides were counted.
    pub fn is_relay(self) -> bool {
        matches!(self, ProcessKind::LlamaSwap | ProcessKind::LiteLlm)
    }
}

/// Why a new listener is probed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeReason {
    /// Its owner is a model server by name.
    Process(ProcessKind),
    /// Its port is one model servers use by default.
    WellKnownPort,
    /// The user named the port (`watch_ports`, `--watch-port`).
    Watched,
}

/// Why a new listener is left alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkipReason {
    /// Not known by name or port, and not named by the user.
    Stranger,
    /// A runner Ollama started for itself: measured as Ollama.
    OllamaRunner,
    /// A server a relay started for itself (llama-swap's llama-server
    /// children): its calls come through the relay and are measured there,
    /// once.
    RelayChild,
    /// One of speedtap's own listeners (its proxy routes, its API).
    Own,
}

/// Whether to probe a listener that just appeared on `port`, owned by
/// `owner` (`None` when the owner can't be read), given the ports the user
/// asked to watch and speedtap's own process id.
pub fn decide(
    port: u16,
    owner: Option<&Owner>,
    watch_ports: &[u16],
    own_pid: i32,
) -> Result<ProbeReason, SkipReason> {
    let kind = owner.and_then(process_kind);
    if let Some(owner) = owner {
        if owner.pid == own_pid && kind.is_none() {
            return Err(SkipReason::Own);
        }
        // Ollama starts its runners (llama-server, or `ollama runner`)
        // as its own children: each is measured as Ollama, never alone.
        if kind.is_some() && owner.parent_comm.as_deref() == Some("ollama") {
            return Err(SkipReason::OllamaRunner);
        }
        if kind.is_some() && owner.parent_comm.as_deref().is_some_and(is_relay_name) {
            return Err(SkipReason::RelayChild);
        }
    }
    if let Some(kind) = kind {
        return Ok(ProbeReason::Process(kind));
    }
    if watch_ports.contains(&port) {
        return Ok(ProbeReason::Watched);
    }
    if WELL_KNOWN_PORTS.contains(&port) {
        return Ok(ProbeReason::WellKnownPort);
    }
    Err(SkipReason::Stranger)
}

/// The model server `owner` is by name, if any.
pub fn process_kind(owner: &Owner) -> Option<ProcessKind> {
    let names = names_of(owner);
    if is_speedtap_simulate(owner) {
        return Some(ProcessKind::SpeedtapSimulate);
    }
    KNOWN_NAMES
        .iter()
        .find(|(_, known)| {
            names
                .iter()
                .any(|name| known.iter().any(|k| is_named(name, k)))
        })
        .map(|(kind, _)| *kind)
}

/// `speedtap simulate`, under speedtap's own name (a copy or link under a
/// model server's name is matched as that server).
fn is_speedtap_simulate(owner: &Owner) -> bool {
    let exe_is_speedtap = owner
        .cmdline
        .first()
        .is_some_and(|arg0| base_name(arg0) == "speedtap");
    exe_is_speedtap && owner.cmdline.iter().skip(1).any(|arg| arg == "simulate")
}

/// The lowercase names a process goes by: its `comm`, its executable's
/// base name, the base names of its first three arguments, and the module
/// after `-m`. The folder a Python script runs from counts only where a
/// server is known by it ([`SCRIPT_FOLDERS`]): any folder name would make
/// `/home/jan/server.py` Jan.
fn names_of(owner: &Owner) -> Vec<String> {
    let mut names = vec![owner.comm.to_lowercase()];
    if let Some(exe) = &owner.exe {
        names.push(base_name(&exe.to_string_lossy()).to_lowercase());
    }
    let args = &owner.cmdline;
    for (i, arg) in args.iter().enumerate().take(3) {
        names.push(base_name(arg).to_lowercase());
        if arg == "-m" {
            if let Some(module) = args.get(i + 1) {
                names.push(module.to_lowercase());
            }
        }
        let folder = Path::new(arg)
            .parent()
            .and_then(Path::file_name)
            .and_then(|f| f.to_str())
            .map(str::to_lowercase);
        if let Some(folder) =
            folder.filter(|f| arg.ends_with(".py") && SCRIPT_FOLDERS.contains(&f.as_str()))
        {
            names.push(folder);
        }
    }
    names
}

/// Servers run as `python main.py` or `python server.py` from their own
/// checkout, known only by the checkout's folder.
const SCRIPT_FOLDERS: &[&str] = &["tabbyapi", "text-generation-webui"];

/// Whether a process name (a parent's `comm`) is a relay's.
fn is_relay_name(comm: &str) -> bool {
    let comm = comm.to_lowercase();
    KNOWN_NAMES
        .iter()
        .filter(|(kind, _)| kind.is_relay())
        .any(|(_, names)| names.iter().any(|n| is_named(&comm, n)))
}

/// Whether a process `name` is the known name `known`: the same, or a
/// release's versioned file of it (`llama-server-b6890`,
/// `ollama-linux-amd64`, `llama-server.exe`). A wrong match costs one
/// probe; only a server that answers like one becomes a route.
fn is_named(name: &str, known: &str) -> bool {
    name.strip_prefix(known)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(['-', '.', '_']))
}

fn base_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn owner(comm: &str, cmdline: &[&str]) -> Owner {
        Owner {
            pid: 42,
            comm: comm.into(),
            exe: cmdline.first().map(PathBuf::from),
            cmdline: cmdline.iter().map(|s| s.to_string()).collect(),
            parent_comm: Some("bash".into()),
        }
    }

    #[test]
    fn model_servers_are_known_by_name_by_executable_by_module_or_by_script() {
        let cases = [
            (
                owner("ollama", &["/usr/local/bin/ollama", "serve"]),
                ProcessKind::Ollama,
            ),
            (
                owner("llama-server", &["./llama-server", "--port", "9931"]),
                ProcessKind::LlamaServer,
            ),
            (
                owner(
                    "vllm",
                    &["/venv/bin/python3", "/venv/bin/vllm", "serve", "m"],
                ),
                ProcessKind::Vllm,
            ),
            (
                owner(
                    "python3",
                    &["python3", "-m", "sglang.launch_server", "--model-path", "m"],
                ),
                ProcessKind::Sglang,
            ),
            (
                owner("python3", &["python3", "koboldcpp.py", "--port", "5001"]),
                ProcessKind::KoboldCpp,
            ),
            (
                owner("python3", &["python", "/home/u/tabbyAPI/main.py"]),
                ProcessKind::TabbyApi,
            ),
            (
                owner(
                    "python3",
                    &["python", "/opt/text-generation-webui/server.py", "--api"],
                ),
                ProcessKind::TextGenerationWebui,
            ),
            (
                owner("llama-swap", &["llama-swap", "--config", "c.yaml"]),
                ProcessKind::LlamaSwap,
            ),
            (
                owner("litellm", &["/venv/bin/python", "/venv/bin/litellm"]),
                ProcessKind::LiteLlm,
            ),
            (
                owner("python3", &["python3", "-m", "mlx_lm.server"]),
                ProcessKind::MlxLm,
            ),
            (
                owner("LM Studio", &["/opt/LM Studio/lm-studio"]),
                ProcessKind::LmStudio,
            ),
            (
                owner(
                    "speedtap",
                    &["/usr/bin/speedtap", "simulate", "--port", "0"],
                ),
                ProcessKind::SpeedtapSimulate,
            ),
        ];
        for (owner, kind) in cases {
            assert_eq!(process_kind(&owner), Some(kind), "{owner:?}");
        }
    }

    #[test]
    fn other_processes_are_no_model_server() {
        for owner in [
            owner("python3", &["python3", "/home/jan/ollama-notes/server.py"]),
            owner("postgres", &["/usr/lib/postgresql/15/bin/postgres"]),
            owner("python3", &["python3", "-m", "http.server", "8000"]),
            owner("node", &["node", "server.js"]),
            owner("speedtap", &["/usr/bin/speedtap", "run"]),
        ] {
            assert_eq!(process_kind(&owner), None, "{owner:?}");
        }
    }

    #[test]
    fn a_stranger_is_probed_only_on_a_well_known_or_watched_port() {
        let postgres = owner("postgres", &["postgres"]);
        assert_eq!(
            decide(5432, Some(&postgres), &[], 1),
            Err(SkipReason::Stranger)
        );
        assert_eq!(
            decide(5432, Some(&postgres), &[5432], 1),
            Ok(ProbeReason::Watched)
        );
        assert_eq!(
            decide(8000, Some(&postgres), &[], 1),
            Ok(ProbeReason::WellKnownPort)
        );
    }

    #[test]
    fn an_unreadable_owner_is_judged_by_its_port_alone() {
        assert_eq!(decide(11434, None, &[], 1), Ok(ProbeReason::WellKnownPort));
        assert_eq!(decide(45678, None, &[], 1), Err(SkipReason::Stranger));
    }

    #[test]
    fn a_model_server_is_probed_on_any_port() {
        let server = owner("llama-server", &["llama-server", "--port", "45678"]);
        assert_eq!(
            decide(45678, Some(&server), &[], 1),
            Ok(ProbeReason::Process(ProcessKind::LlamaServer))
        );
    }

    #[test]
    fn ollamas_own_runner_is_never_a_server_of_its_own() {
        let mut runner = owner(
            "llama-server",
            &["/usr/lib/ollama/llama-server", "--port", "41234"],
        );
        runner.parent_comm = Some("ollama".into());
        assert_eq!(
            decide(41234, Some(&runner), &[], 1),
            Err(SkipReason::OllamaRunner)
        );
    }

    #[test]
    fn a_releases_versioned_binary_is_its_kind_and_ollamas_own_runner_never_is() {
        let versioned = owner(
            "llama-server-0.",
            &["/home/u/.cache/llama-server-0.3.36-x86v3", "--port", "8099"],
        );
        assert_eq!(process_kind(&versioned), Some(ProcessKind::LlamaServer));
        let release = owner("ollama-linux-am", &["/opt/ollama-linux-amd64", "serve"]);
        assert_eq!(process_kind(&release), Some(ProcessKind::Ollama));
        assert_eq!(process_kind(&owner("janitor", &["/usr/bin/janitor"])), None);
        let mut runner = owner("ollama", &["/usr/bin/ollama", "runner", "--port", "40001"]);
        runner.parent_comm = Some("ollama".into());
        assert_eq!(
            decide(40001, Some(&runner), &[], 1),
            Err(SkipReason::OllamaRunner)
        );
    }

    #[test]
    fn a_server_a_relay_started_is_measured_through_the_relay_only() {
        let mut child = owner("llama-server", &["/usr/bin/llama-server", "--port", "5801"]);
        child.parent_comm = Some("llama-swap".into());
        assert_eq!(
            decide(5801, Some(&child), &[], 1),
            Err(SkipReason::RelayChild)
        );
        let relay = owner("llama-swap", &["/usr/bin/llama-swap", "--listen", ":8080"]);
        assert_eq!(
            decide(8080, Some(&relay), &[], 1),
            Ok(ProbeReason::Process(ProcessKind::LlamaSwap))
        );
    }

    #[test]
    fn speedtaps_own_listeners_are_skipped_even_on_a_well_known_port() {
        let me = owner("speedtap", &["/usr/bin/speedtap", "run"]);
        assert_eq!(decide(11435, Some(&me), &[], 42), Err(SkipReason::Own));
        assert_eq!(decide(8080, Some(&me), &[], 42), Err(SkipReason::Own));
    }

    #[test]
    fn relays_are_the_ones_that_forward_to_other_servers() {
        assert!(ProcessKind::LlamaSwap.is_relay() && ProcessKind::LiteLlm.is_relay());
        assert!(!ProcessKind::Ollama.is_relay());
    }
}
