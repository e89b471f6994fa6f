//! From the layers to the settings the engine runs with: built-in defaults
//! < config file < flags ([`resolve`]), and the checks that need more than
//! one value (addresses that collide, remote addresses without
//! `allow_remote`), naming the flag or the file's line to fix.

use std::net::SocketAddr;

use super::defs::{check_table_flags, merge_table};
pub use super::defs::{CliOverrides, Settings};
use super::entries::{Lines, RouteLines};
use super::file::ConfigFile;
use super::loops::upstream_reaches;
use super::values::DbSetting;
use super::{ConfigError, DEFAULT_API};
use crate::model::route::RouteSpec;

/// Where a setting came from, for error messages.
enum Source<'a> {
    Flag(&'a str),
    Line(usize),
    Default,
}

/// Builds the errors of one resolution: a flag's, a line of the file's,
/// or the file's as a whole (a default that clashes with what it says).
struct Blame<'a> {
    file_name: String,
    lines: Option<&'a Lines>,
}

impl Blame<'_> {
    fn at(&self, src: &Source<'_>, message: String) -> ConfigError {
        match src {
            Source::Flag(flag) => ConfigError::Flag {
                flag: (*flag).to_string(),
                message,
            },
            Source::Line(line) => ConfigError::AtLine {
                file: self.file_name.clone(),
                line: *line,
                message,
            },
            Source::Default => ConfigError::InFile {
                file: self.file_name.clone(),
                message,
            },
        }
    }

    /// How a remote address is allowed: the flag, and the file when there
    /// is one.
    fn remote_hint(&self) -> &'static str {
        if self.lines.is_some() {
            " (or allow_remote = true in the config file)"
        } else {
            ""
        }
    }

    /// The lines of a file route, when `route` came from the file as parsed.
    fn route_lines(&self, route: &RouteSpec) -> Option<&RouteLines> {
        self.lines
            .and_then(|o| o.routes.iter().find(|(r, _)| r == route).map(|(_, l)| l))
    }
}

/// Merges defaults < config file < flags and validates the result.
///
/// Choices:
/// - Routes given as flags replace the file's routes rather than add to them,
///   so a one-off `--route` isn't mixed with (and doesn't collide with) the
///   file's.
/// - `allow_remote` is on if either the flag or the file says so.
/// - `--db` together with `--no-db` is a usage error.
/// - Two listeners collide when their ports match and their addresses are
///   equal or either is a wildcard (0.0.0.0 / ::), because binding would fail
///   the same way. Port 0 ("any free port") never collides.
pub fn resolve(file: Option<ConfigFile>, flags: CliOverrides) -> Result<Settings, ConfigError> {
    let file = file.unwrap_or_default();
    let blame = Blame {
        file_name: file.file_name().unwrap_or("config").to_string(),
        lines: file.origin.0.as_ref(),
    };
    check_flags(&flags)?;
    // The plain settings first: whether remote addresses are allowed
    // decides what the API and the routes may listen on.
    let mut settings = merge_table(&file, &flags);
    let allow_remote = settings.allow_remote;
    let api = resolve_api(&flags, &file, &blame, allow_remote)?;
    let flag_routes = !flags.routes.is_empty();
    let routes = if flag_routes {
        flags.routes.clone()
    } else {
        file.routes.clone()
    };
    check_routes(&routes, flag_routes, &blame, allow_remote, api)?;
    check_loops(&routes, flag_routes, &blame, api)?;
    settings.db = resolve_db(&flags, &file);
    settings.routes = routes;
    settings.api = api;
    settings.capture_routes = flags.capture_routes;
    Ok(settings)
}

/// The flags' own checks, by the file's rules: a count of 0, a bad OTLP
/// endpoint (the plain settings', from the table), `--db` with `--no-db`.
fn check_flags(flags: &CliOverrides) -> Result<(), ConfigError> {
    let flag_error = |flag: &str, message: String| ConfigError::Flag {
        flag: flag.into(),
        message,
    };
    if flags.no_db && flags.db.is_some() {
        return Err(flag_error("--no-db", "can't be combined with --db".into()));
    }
    check_table_flags(flags)
}

/// The API address (flag, file, default), which must be loopback unless
/// remote addresses are allowed.
fn resolve_api(
    flags: &CliOverrides,
    file: &ConfigFile,
    blame: &Blame<'_>,
    allow_remote: bool,
) -> Result<SocketAddr, ConfigError> {
    let (api, api_src) = match (flags.api, file.api) {
        (Some(a), _) => (a, Source::Flag("--api")),
        (None, Some(a)) => (
            a,
            blame
                .lines
                .and_then(|o| o.api_line)
                .map_or(Source::Default, Source::Line),
        ),
        (None, None) => (DEFAULT_API, Source::Default),
    };
    if !allow_remote && !api.ip().is_loopback() {
        let hint = blame.remote_hint();
        return Err(blame.at(
            &api_src,
            format!("api: listening on {api} needs --allow-remote{hint}"),
        ));
    }
    Ok(api)
}

/// Each route against the others and the API: a name used twice, a remote
/// listener not allowed, a listener on the API's or another route's
/// address. Names the route's flag, or its line in the file.
fn check_routes(
    routes: &[RouteSpec],
    flag_routes: bool,
    blame: &Blame<'_>,
    allow_remote: bool,
    api: SocketAddr,
) -> Result<(), ConfigError> {
    for (i, route) in routes.iter().enumerate() {
        let lines = if flag_routes {
            None
        } else {
            blame.route_lines(route)
        };
        let flag = format!("--route {}", route.name);
        let name_src = lines.map_or(Source::Flag(&flag), |l| Source::Line(l.name));
        let listen_src = lines.map_or(Source::Flag(&flag), |l| Source::Line(l.listen));
        let name = &route.name;
        let listen = route.listen;

        if routes[..i].iter().any(|r| r.name == *name) {
            return Err(blame.at(&name_src, format!("route name {name:?} is used twice")));
        }
        if !allow_remote && !listen.ip().is_loopback() {
            let hint = blame.remote_hint();
            return Err(blame.at(
                &listen_src,
                format!("route {name:?}: listening on {listen} needs --allow-remote{hint}"),
            ));
        }
        if collides(listen, api) {
            return Err(blame.at(
                &listen_src,
                format!(
                    "route {name:?}: listen address {listen} is the control API's address ({api})"
                ),
            ));
        }
        if let Some(other) = routes[..i].iter().find(|r| collides(r.listen, listen)) {
            return Err(blame.at(
                &listen_src,
                format!(
                    "route {name:?}: listen address {listen} is already used by route {:?}",
                    other.name
                ),
            ));
        }
    }
    Ok(())
}

/// No route's upstream may be one of speedtap's own listeners (a route's,
/// its own included, or the control API's): each request would come back
/// round and be forwarded again, without end. Names the route's flag, or
/// the line of its `upstream` in the file.
fn check_loops(
    routes: &[RouteSpec],
    flag_routes: bool,
    blame: &Blame<'_>,
    api: SocketAddr,
) -> Result<(), ConfigError> {
    let listeners = routes
        .iter()
        .map(|r| (format!("route {:?}'s listener", r.name), r.listen))
        .chain(std::iter::once(("the control API".to_owned(), api)));
    let listeners: Vec<(String, SocketAddr)> = listeners.collect();
    for route in routes {
        let Some((what, addr)) = listeners
            .iter()
            .find(|(_, addr)| upstream_reaches(&route.upstream, *addr))
        else {
            continue;
        };
        let flag = format!("--route {}", route.name);
        let src = match blame.route_lines(route).filter(|_| !flag_routes) {
            Some(lines) => Source::Line(lines.upstream),
            None => Source::Flag(&flag),
        };
        return Err(blame.at(
            &src,
            format!(
                "route {:?}: upstream {} is speedtap's own address ({what}, {addr}): \
                 every request would loop back into speedtap; point it at the model server",
                route.name, route.upstream
            ),
        ));
    }
    Ok(())
}

/// `--no-db` over `--db` over the file's `db` over the default file.
fn resolve_db(flags: &CliOverrides, file: &ConfigFile) -> DbSetting {
    if flags.no_db {
        DbSetting::None
    } else if let Some(p) = &flags.db {
        DbSetting::File(p.clone())
    } else {
        file.db.clone().unwrap_or(DbSetting::Default)
    }
}

/// Whether binding both addresses would clash. See [`resolve`].
fn collides(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{parse_config, parse_route_flag, ProxySettings};

    #[test]
    fn resolve_names_the_file_line_for_file_routes_and_the_flag_for_flag_routes() {
        let text = "[[route]]\nname = \"a\"\nlisten = \"0.0.0.0:9001\"\nupstream = \"http://127.0.0.1:9000\"\n";
        let file = parse_config(text, "s.toml").unwrap();
        let e = resolve(Some(file), CliOverrides::default())
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("s.toml line 3: "), "{e}");
        assert!(
            e.contains("listening on 0.0.0.0:9001 needs --allow-remote"),
            "{e}"
        );

        let flags = CliOverrides {
            routes: vec![parse_route_flag("b=0.0.0.0:9001=http://127.0.0.1:9000").unwrap()],
            ..Default::default()
        };
        let e = resolve(None, flags).unwrap_err().to_string();
        assert_eq!(
            e,
            "--route b: route \"b\": listening on 0.0.0.0:9001 needs --allow-remote"
        );
    }

    #[test]
    fn a_route_whose_upstream_is_a_speedtap_listener_is_refused_naming_its_upstream_line() {
        let text = "api = \"127.0.0.1:7999\"\n\n[[route]]\nname = \"a\"\nlisten = \"127.0.0.1:9101\"\nupstream = \"http://127.0.0.1:9102\"\n\n[[route]]\nname = \"b\"\nlisten = \"0.0.0.0:9102\"\nupstream = \"http://localhost:9101\"\n";
        let file = parse_config(text, "s.toml").unwrap();
        let flags = CliOverrides {
            allow_remote: true,
            ..Default::default()
        };
        let e = resolve(Some(file), flags).unwrap_err().to_string();
        assert_eq!(
            e,
            "s.toml line 6: route \"a\": upstream http://127.0.0.1:9102 is speedtap's own \
             address (route \"b\"'s listener, 0.0.0.0:9102): every request would loop back \
             into speedtap; point it at the model server"
        );
        let flags = CliOverrides {
            routes: vec![parse_route_flag("c=127.0.0.1:9103=http://127.0.0.1:7999").unwrap()],
            api: Some("127.0.0.1:7999".parse().unwrap()),
            ..Default::default()
        };
        let e = resolve(None, flags).unwrap_err().to_string();
        assert!(e.starts_with("--route c: route \"c\": upstream"), "{e}");
        assert!(e.contains("(the control API, 127.0.0.1:7999)"), "{e}");
    }

    #[test]
    fn wildcard_listeners_collide_with_specific_ones_on_the_same_port() {
        let a: SocketAddr = "0.0.0.0:80".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:80".parse().unwrap();
        let c: SocketAddr = "127.0.0.2:80".parse().unwrap();
        let z: SocketAddr = "127.0.0.1:0".parse().unwrap();
        assert!(collides(a, b) && collides(b, a));
        assert!(!collides(b, c));
        assert!(!collides(z, z));
    }

    #[test]
    fn a_zero_flag_is_refused_by_the_files_rule_naming_the_flag() {
        let flags = CliOverrides {
            proxy: ProxySettings {
                max_head_kib: Some(0),
                ..Default::default()
            },
            ..Default::default()
        };
        let e = resolve(None, flags).unwrap_err().to_string();
        assert_eq!(e, "--max-head-kib: must be at least 1");
    }
}
