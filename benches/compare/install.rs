//! Getting the peer proxies onto the machine: nginx from Debian's
//! packages, LiteLLM into a virtualenv under the target dir.
//!
//! The full run installs what is missing and says so; the smoke run (CI)
//! installs only when `SPEEDTAP_BENCH_INSTALL=1`, so a plain
//! `cargo test --all-targets` never touches the system. Whatever can't be
//! had comes back as an `Err(reason)` that the report shows as
//! `skipped (reason)`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// The LiteLLM release measured (the reference's; newer releases need a
/// package the registry here doesn't serve).
pub const LITELLM_VERSION: &str = "1.108.7";

/// The pip requirements of the LiteLLM arm.
const LITELLM_REQS: [&str; 2] = ["litellm[proxy]==1.108.7", "prometheus_client>=0.20,<1"];

/// The cargo target dir (`CARGO_TARGET_TMPDIR` is `<target>/tmp`).
pub fn target_dir() -> PathBuf {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().map(Path::to_path_buf).unwrap_or(tmp)
}

/// The virtualenv holding LiteLLM.
pub fn venv_dir() -> PathBuf {
    target_dir().join("bench-venv")
}

/// Written after a successful install, so a half-finished venv is redone.
fn venv_marker() -> PathBuf {
    venv_dir().join(format!(".speedtap-bench-litellm-{LITELLM_VERSION}"))
}

/// Where an `nginx` binary is, if any (Debian puts it in /usr/sbin, which
/// a non-root PATH may lack).
pub fn find_nginx() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/local/sbin")])
        .map(|d| d.join("nginx"))
        .find(|p| p.is_file())
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Runs `cmd`, returning its stderr's tail as the error.
fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let tail: Vec<&str> = err.lines().rev().take(3).collect();
    Err(format!(
        "{:?} failed ({}): {}",
        cmd.get_program(),
        out.status,
        tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
    ))
}

/// The nginx binary, installing the Debian package first when allowed.
pub fn ensure_nginx(allowed: bool) -> Result<PathBuf, String> {
    if let Some(bin) = find_nginx() {
        return Ok(bin);
    }
    if !allowed {
        return Err("nginx not installed (set SPEEDTAP_BENCH_INSTALL=1 to install it)".into());
    }
    let sudo: &[&str] = if is_root() { &[] } else { &["sudo", "-n"] };
    let apt = |args: &[&str]| {
        let mut all: Vec<&str> = sudo.to_vec();
        all.push("apt-get");
        all.extend_from_slice(args);
        let mut cmd = Command::new(all[0]);
        cmd.args(&all[1..]).env("DEBIAN_FRONTEND", "noninteractive");
        run(&mut cmd)
    };
    println!("compare: installing nginx (apt-get install nginx)...");
    let t = Instant::now();
    apt(&["update", "-qq"])?;
    apt(&["install", "-y", "-qq", "--no-install-recommends", "nginx"])?;
    println!(
        "compare: nginx installed in {:.0} s",
        t.elapsed().as_secs_f64()
    );
    find_nginx().ok_or_else(|| "apt-get installed nginx but no nginx binary was found".into())
}

/// The `litellm` launcher in the venv, creating the venv when allowed.
pub fn ensure_litellm(allowed: bool) -> Result<PathBuf, String> {
    let bin = venv_dir().join("bin").join("litellm");
    if bin.is_file() && venv_marker().is_file() {
        return Ok(bin);
    }
    if !allowed {
        return Err(format!(
            "LiteLLM not installed in {} (set SPEEDTAP_BENCH_INSTALL=1 to install it)",
            venv_dir().display()
        ));
    }
    println!(
        "compare: installing LiteLLM {LITELLM_VERSION} into {} (pip)...",
        venv_dir().display()
    );
    let t = Instant::now();
    run(Command::new("python3").args(["-m", "venv"]).arg(venv_dir()))?;
    run(Command::new(venv_dir().join("bin").join("pip"))
        .args(["install", "--quiet", "--disable-pip-version-check"])
        .args(LITELLM_REQS))?;
    std::fs::write(venv_marker(), LITELLM_REQS.join("\n"))
        .map_err(|e| format!("cannot write {}: {e}", venv_marker().display()))?;
    println!(
        "compare: LiteLLM installed in {:.0} s",
        t.elapsed().as_secs_f64()
    );
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!("pip finished but {} is missing", bin.display()))
    }
}
