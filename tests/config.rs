//! The config file, `--route` flags and their merge (`speedtap::config`).
//!
//! Fixtures: every file in `tests/configs/valid` must parse and resolve;
//! every file in `tests/configs/invalid` must fail (in parsing or resolving)
//! with a message naming its expected line and holding a fragment, both
//! given on its first line as `# expect: line N: FRAGMENT`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use speedtap::config::{
    load_config, parse_config, parse_route_flag, resolve, save_config, CliOverrides, ConfigError,
    ConfigFile, DbSetting, ProxySettings, Settings,
};

use speedtap::model::{RouteSpec, Upstream};

fn fixtures(kind: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/configs")
        .join(kind);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    files
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn route(flag: &str) -> RouteSpec {
    parse_route_flag(flag).unwrap()
}

/// Parses then resolves with no flags: the whole path a config file takes.
fn load_and_resolve(path: &Path) -> Result<Settings, ConfigError> {
    let file = load_config(path)?;
    resolve(Some(file), CliOverrides::default())
}

#[test]
fn every_valid_fixture_parses_and_resolves() {
    let files = fixtures("valid");
    assert!(files.len() >= 4, "fixtures missing: {files:?}");
    for path in files {
        if let Err(e) = load_and_resolve(&path) {
            panic!("{}: {e}", path.display());
        }
    }
}

#[test]
fn every_invalid_fixture_fails_naming_its_line() {
    let files = fixtures("invalid");
    assert!(files.len() >= 15, "fixtures missing: {files:?}");
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let first = text.lines().next().unwrap_or_default();
        let expect = first.strip_prefix("# expect: line ").unwrap_or_else(|| {
            panic!(
                "{}: first line must be `# expect: line N: ...`",
                path.display()
            )
        });
        let (line, fragment) = expect
            .split_once(": ")
            .unwrap_or((expect.trim_end_matches(':'), ""));
        let line: usize = line.parse().unwrap();
        assert!(
            !fragment.trim().is_empty(),
            "{}: give a fragment to expect",
            path.display()
        );

        let err = match load_and_resolve(&path) {
            Ok(_) => panic!("{}: expected an error", path.display()),
            Err(e) => e,
        };
        let msg = err.to_string();
        assert_eq!(err.line(), Some(line), "{}: {msg}", path.display());
        assert!(
            msg.starts_with(&format!("{} line {line}: ", path.display())),
            "{}: {msg}",
            path.display()
        );
        assert!(
            msg.contains(fragment.trim_end()),
            "{}: {msg:?} lacks {fragment:?}",
            path.display()
        );
    }
}

#[test]
fn the_full_fixture_sets_every_key() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/configs/valid/full.toml");
    let s = load_and_resolve(&path).unwrap();
    assert_eq!(s.slow_ttft_ms, 8000);
    assert_eq!(s.api, addr("127.0.0.1:7900"));
    // A relative db path is anchored to the config file's directory.
    assert_eq!(
        s.db,
        DbSetting::File(path.parent().unwrap().join("speedtap-test.sqlite3"))
    );
    assert!(!s.allow_remote && s.notifications && s.notify_settled && !s.json);
    assert_eq!(s.idle_timeout, Some(std::time::Duration::from_secs(300)));
    assert_eq!((s.retention_days, s.max_db_mb), (30, 256));
    assert_eq!(s.otlp_endpoint.as_deref(), Some("http://127.0.0.1:4318"));
    assert_eq!(
        s.proxy,
        ProxySettings {
            head_timeout: Some(std::time::Duration::from_secs(20)),
            max_head_kib: Some(64),
            max_connections: Some(512),
        }
    );
    assert_eq!(s.watch_ports, [7000, 9500]);
    let names: Vec<&str> = s.routes.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["ollama", "llamacpp"]);
    assert_eq!(s.routes[1].listen, addr("127.0.0.1:8081"));
    assert_eq!(s.routes[1].upstream.base_url(), "http://127.0.0.1:8080");
}

#[test]
fn defaults_apply_without_file_or_flags() {
    let s = resolve(None, CliOverrides::default()).unwrap();
    assert_eq!(s, Settings::default());
    assert_eq!(s.api, addr("127.0.0.1:7878"));
    assert_eq!(s.slow_ttft_ms, 5000);
    assert_eq!(s.db, DbSetting::Default);
    assert!(s.routes.is_empty() && s.notifications && !s.notify_settled && !s.allow_remote);
}

#[test]
fn route_flag_splits_on_the_first_two_equals_signs() {
    let r = route("ollama=127.0.0.1:11435=http://127.0.0.1:11434");
    assert_eq!(r.name, "ollama");
    assert_eq!(r.listen, addr("127.0.0.1:11435"));
    assert_eq!(
        r.upstream,
        Upstream {
            host: "127.0.0.1".into(),
            port: 11434,
            base_path: String::new()
        }
    );

    // The upstream may hold `=` (in its path); it stays intact.
    let r = route("x=127.0.0.1:9001=http://127.0.0.1:9000/a=b/c=d");
    assert_eq!(r.upstream.base_path, "/a=b/c=d");
    assert_eq!(
        r.upstream.join("/v1/models"),
        "http://127.0.0.1:9000/a=b/c=d/v1/models"
    );
}

#[test]
fn route_flag_rejects_missing_or_bad_parts() {
    for (bad, fragment) in [
        ("ollama", "expected NAME=LISTEN=UPSTREAM"),
        ("ollama=127.0.0.1:11435", "expected NAME=LISTEN=UPSTREAM"),
        (
            "=127.0.0.1:11435=http://127.0.0.1:11434",
            "expected NAME=LISTEN=UPSTREAM",
        ),
        (
            "ollama==http://127.0.0.1:11434",
            "expected NAME=LISTEN=UPSTREAM",
        ),
        ("ollama=127.0.0.1:11435=", "expected NAME=LISTEN=UPSTREAM"),
        (
            "ollama=11435=http://127.0.0.1:11434",
            "not a HOST:PORT address",
        ),
        (
            "ollama=127.0.0.1:11435=127.0.0.1:11434",
            "not an http:// URL",
        ),
        (
            "ollama=127.0.0.1:11435=https://127.0.0.1:11434",
            "https:// is not supported",
        ),
        (
            "a b=127.0.0.1:11435=http://127.0.0.1:11434",
            "may only hold",
        ),
    ] {
        let e = parse_route_flag(bad).unwrap_err();
        assert!(e.contains(fragment), "{bad}: {e}");
    }
}

#[test]
fn store_otlp_and_proxy_limits_resolve_defaults_then_file_then_flags() {
    // Defaults.
    let s = resolve(None, CliOverrides::default()).unwrap();
    assert_eq!((s.retention_days, s.max_db_mb), (90, 1024));
    assert_eq!(s.otlp_endpoint, None);
    assert_eq!(s.proxy, ProxySettings::default());

    // The file over the defaults.
    let file = parse_config(
        "retention_days = 7\nmax_db_mb = 64\notlp_endpoint = \"http://127.0.0.1:4318\"\n\
         head_timeout = \"15s\"\nmax_head_kib = 32\nmax_connections = 100\n",
        "s.toml",
    )
    .unwrap();
    let s = resolve(Some(file.clone()), CliOverrides::default()).unwrap();
    assert_eq!((s.retention_days, s.max_db_mb), (7, 64));
    assert_eq!(s.otlp_endpoint.as_deref(), Some("http://127.0.0.1:4318"));
    assert_eq!(
        s.proxy,
        ProxySettings {
            head_timeout: Some(std::time::Duration::from_secs(15)),
            max_head_kib: Some(32),
            max_connections: Some(100),
        }
    );

    // Flags over the file, field by field: what a flag leaves unset keeps
    // the file's value.
    let flags = CliOverrides {
        retention_days: Some(3),
        otlp_endpoint: Some("http://collector.example:4318".into()),
        proxy: ProxySettings {
            max_connections: Some(9),
            ..Default::default()
        },
        ..Default::default()
    };
    let s = resolve(Some(file), flags).unwrap();
    assert_eq!((s.retention_days, s.max_db_mb), (3, 64));
    assert_eq!(
        s.otlp_endpoint.as_deref(),
        Some("http://collector.example:4318")
    );
    assert_eq!(s.proxy.max_connections, Some(9));
    assert_eq!(s.proxy.max_head_kib, Some(32));

    // A saved file reads back with the same values.
    let back = parse_config(&s_to_file(&s).to_toml(), "back.toml").unwrap();
    assert_eq!(back.proxy, s.proxy);
    assert_eq!(back.otlp_endpoint, s.otlp_endpoint);
}

fn s_to_file(s: &Settings) -> ConfigFile {
    let mut file = ConfigFile::default();
    file.retention_days = Some(s.retention_days);
    file.max_db_mb = Some(s.max_db_mb);
    file.otlp_endpoint = s.otlp_endpoint.clone();
    file.proxy = s.proxy.clone();
    file
}

#[test]
fn bad_store_otlp_and_limit_flags_name_the_flag() {
    for (flags, flag, fragment) in [
        (
            CliOverrides {
                retention_days: Some(0),
                ..Default::default()
            },
            "--retention-days",
            "at least 1",
        ),
        (
            CliOverrides {
                max_db_mb: Some(0),
                ..Default::default()
            },
            "--max-db-mb",
            "at least 1",
        ),
        (
            CliOverrides {
                proxy: ProxySettings {
                    max_connections: Some(0),
                    ..Default::default()
                },
                ..Default::default()
            },
            "--max-connections",
            "at least 1",
        ),
        (
            CliOverrides {
                otlp_endpoint: Some("127.0.0.1:4318".into()),
                ..Default::default()
            },
            "--otlp-endpoint",
            "is not an http:// URL",
        ),
    ] {
        let e = resolve(None, flags).unwrap_err();
        assert!(
            matches!(&e, ConfigError::Flag { flag: f, .. } if f == flag),
            "{e}"
        );
        assert!(e.to_string().contains(fragment), "{e}");
    }
}

#[test]
fn flags_override_the_file_which_overrides_defaults() {
    let file = parse_config(
        "slow_ttft_ms = 7000\napi = \"127.0.0.1:7900\"\ndb = \"/var/x.db\"\nnotifications = false\n\
         [[route]]\nname = \"ollama\"\nlisten = \"127.0.0.1:11435\"\nupstream = \"http://127.0.0.1:11434\"\n",
        "s.toml",
    )
    .unwrap();

    // File over defaults.
    let s = resolve(Some(file.clone()), CliOverrides::default()).unwrap();
    assert_eq!(s.slow_ttft_ms, 7000);
    assert_eq!(s.api, addr("127.0.0.1:7900"));
    assert_eq!(s.db, DbSetting::File("/var/x.db".into()));
    assert!(!s.notifications);
    assert_eq!(
        s.routes,
        vec![route("ollama=127.0.0.1:11435=http://127.0.0.1:11434")]
    );

    // Flags over the file; flag routes replace the file's.
    let flags = CliOverrides {
        routes: vec![route("llama=127.0.0.1:8081=http://127.0.0.1:8080")],
        api: Some(addr("127.0.0.1:7901")),
        db: Some("/tmp/y.db".into()),
        slow_ttft_ms: Some(100),
        json: true,
        ..Default::default()
    };
    let s = resolve(Some(file.clone()), flags).unwrap();
    assert_eq!(s.slow_ttft_ms, 100);
    assert_eq!(s.api, addr("127.0.0.1:7901"));
    assert_eq!(s.db, DbSetting::File("/tmp/y.db".into()));
    assert!(s.json);
    assert_eq!(
        s.routes,
        vec![route("llama=127.0.0.1:8081=http://127.0.0.1:8080")]
    );

    // --no-db beats the file's db; --db with --no-db is a usage error.
    let s = resolve(
        Some(file.clone()),
        CliOverrides {
            no_db: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(s.db, DbSetting::None);
    let e = resolve(
        Some(file),
        CliOverrides {
            no_db: true,
            db: Some("/x".into()),
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(matches!(e, ConfigError::Flag { .. }));
    assert!(e.to_string().contains("--no-db"), "{e}");
}

#[test]
fn non_loopback_addresses_need_allow_remote() {
    let remote = || CliOverrides {
        routes: vec![route("ollama=0.0.0.0:11435=http://127.0.0.1:11434")],
        ..Default::default()
    };
    let e = resolve(None, remote()).unwrap_err().to_string();
    assert!(
        e.contains("listening on 0.0.0.0:11435 needs --allow-remote"),
        "{e}"
    );
    assert!(e.starts_with("--route ollama: "), "{e}");

    let s = resolve(
        None,
        CliOverrides {
            allow_remote: true,
            ..remote()
        },
    )
    .unwrap();
    assert!(s.allow_remote);
    assert_eq!(s.routes[0].listen, addr("0.0.0.0:11435"));

    // The file may allow it too.
    let file = parse_config("allow_remote = true", "s.toml").unwrap();
    assert!(resolve(Some(file), remote()).is_ok());

    // The API address follows the same rule.
    let api = || CliOverrides {
        api: Some(addr("192.168.1.5:7878")),
        ..Default::default()
    };
    let e = resolve(None, api()).unwrap_err().to_string();
    assert_eq!(
        e,
        "--api: api: listening on 192.168.1.5:7878 needs --allow-remote"
    );
    assert!(resolve(
        None,
        CliOverrides {
            allow_remote: true,
            ..api()
        }
    )
    .is_ok());

    // Loopback in any form needs nothing.
    let local = CliOverrides {
        routes: vec![
            route("a=127.0.0.2:9001=http://127.0.0.1:9000"),
            route("b=[::1]:9001=http://127.0.0.1:9000"),
        ],
        ..Default::default()
    };
    assert!(resolve(None, local).is_ok());
}

#[test]
fn flag_routes_are_checked_like_file_routes() {
    let twice = CliOverrides {
        routes: vec![
            route("a=127.0.0.1:9001=http://127.0.0.1:9000"),
            route("a=127.0.0.1:9002=http://127.0.0.1:9000"),
        ],
        ..Default::default()
    };
    assert_eq!(
        resolve(None, twice).unwrap_err().to_string(),
        "--route a: route name \"a\" is used twice"
    );
    let same_port = CliOverrides {
        routes: vec![
            route("a=127.0.0.1:9001=http://127.0.0.1:9000"),
            route("b=127.0.0.1:9001=http://127.0.0.1:9000"),
        ],
        ..Default::default()
    };
    let e = resolve(None, same_port).unwrap_err().to_string();
    assert!(e.contains("already used by route \"a\""), "{e}");
    let on_api = CliOverrides {
        routes: vec![route("a=127.0.0.1:7878=http://127.0.0.1:9000")],
        ..Default::default()
    };
    let e = resolve(None, on_api).unwrap_err().to_string();
    assert!(e.contains("is the control API's address"), "{e}");
    // Port 0 (any free port) never collides: tests run many such routes.
    let any = CliOverrides {
        routes: vec![
            route("a=127.0.0.1:0=http://127.0.0.1:9000"),
            route("b=127.0.0.1:0=http://127.0.0.1:9000"),
        ],
        api: Some(addr("127.0.0.1:0")),
        ..Default::default()
    };
    assert!(resolve(None, any).is_ok());
}

#[test]
fn slow_ttft_flag_of_zero_is_refused() {
    let e = resolve(
        None,
        CliOverrides {
            slow_ttft_ms: Some(0),
            ..Default::default()
        },
    )
    .unwrap_err();
    assert_eq!(e.to_string(), "--slow-ttft-ms: must be at least 1");
}

#[test]
fn a_missing_file_names_the_path() {
    let path = Path::new("definitely/not/here/speedtap.toml");
    let e = load_config(path).unwrap_err();
    assert!(matches!(e, ConfigError::Io { .. }));
    assert!(
        e.to_string()
            .starts_with("definitely/not/here/speedtap.toml: "),
        "{e}"
    );
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("speedtap-config-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn save_config_round_trips_with_user_only_permissions() {
    let dir = temp_dir("save");
    let path = dir.join("nested").join("speedtap.toml");

    let mut file = ConfigFile::default();
    file.slow_ttft_ms = Some(4200);
    file.api = Some(addr("127.0.0.1:7999"));
    file.notifications = Some(false);
    file.notify_settled = Some(true);
    file.db = Some(DbSetting::None);
    file.routes = vec![
        route("ollama=127.0.0.1:11435=http://127.0.0.1:11434"),
        route("v6=[::1]:8001=http://[::1]:8000/prefix"),
    ];
    save_config(&path, &file).unwrap();

    let back = load_config(&path).unwrap();
    assert_eq!(back, file);
    assert_eq!(back.file_name(), Some(path.display().to_string().as_str()));

    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "mode {mode:o}");
    }

    // Saving again replaces the file (no leftovers) and keeps the mode.
    file.routes.pop();
    file.db = Some(DbSetting::File("/abs/x.sqlite3".into()));
    save_config(&path, &file).unwrap();
    assert_eq!(load_config(&path).unwrap(), file);
    let entries: Vec<_> = std::fs::read_dir(path.parent().unwrap()).unwrap().collect();
    assert_eq!(entries.len(), 1, "temp file left behind: {entries:?}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    // An empty file saves to something that parses back empty.
    save_config(&path, &ConfigFile::default()).unwrap();
    assert_eq!(load_config(&path).unwrap(), ConfigFile::default());

    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn saved_text_reads_like_the_contract() {
    let mut file = ConfigFile::default();
    file.slow_ttft_ms = Some(5000);
    file.api = Some(addr("127.0.0.1:7878"));
    file.routes = vec![route("ollama=127.0.0.1:11435=http://127.0.0.1:11434")];
    let text = file.to_toml();
    assert!(text.contains("slow_ttft_ms = 5000\n"), "{text}");
    assert!(text.contains("api = \"127.0.0.1:7878\"\n"), "{text}");
    assert!(text.contains("[[route]]\nname = \"ollama\"\nlisten = \"127.0.0.1:11435\"\nupstream = \"http://127.0.0.1:11434\"\n"), "{text}");
}
