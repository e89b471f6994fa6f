//! The config file's entries that the settings table ([`super::defs`])
//! leaves to hand-written code: where a parsed file's values came from
//! (for [`super::resolve()`](mod@super::resolve)'s messages), the `api`
//! address and the `[[route]]` tables as written, and the routes as saved.
//! Apart from [`super::file`] so that the table and the file's reader
//! can both name them.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize, Serializer};
use toml::Spanned;

use super::values;
use crate::model::route::RouteSpec;

/// Where a parsed file's values came from, for [`super::resolve()`]'s
/// messages. Never makes two files differ: equality is about settings.
#[derive(Clone, Debug, Default)]
pub(super) struct Origin(pub(super) Option<Lines>);

impl PartialEq for Origin {
    fn eq(&self, _: &Origin) -> bool {
        true
    }
}

/// The file's name and the lines of the values resolve checks again.
#[derive(Clone, Debug)]
pub(super) struct Lines {
    pub(super) file: String,
    pub(super) api_line: Option<usize>,
    /// Each parsed route with its lines. Looked up by value, so routes the
    /// tray added or edited since simply have no line.
    pub(super) routes: Vec<(RouteSpec, RouteLines)>,
}

/// Lines of one route's entries, for errors found in [`super::resolve()`].
#[derive(Clone, Debug)]
pub(super) struct RouteLines {
    pub(super) name: usize,
    pub(super) listen: usize,
    pub(super) upstream: usize,
}

/// A listen address read by the routes' rule (`api`).
pub(super) struct ListenAddr(pub(super) SocketAddr);

impl<'de> Deserialize<'de> for ListenAddr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        values::de_listen(d).map(ListenAddr)
    }
}

/// One `[[route]]` as written; checked by [`super::file`]'s reader, which
/// names the route in its messages.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RouteEntry {
    pub(super) name: Spanned<String>,
    pub(super) listen: Spanned<String>,
    pub(super) upstream: Spanned<String>,
}

/// One `[[route]]` as [`super::save_config`] writes it.
#[derive(Serialize)]
struct SavedRoute {
    name: String,
    listen: String,
    upstream: String,
}

/// Writes the routes as `[[route]]` tables, the way they are read.
pub(super) fn write_routes<S: Serializer>(routes: &[RouteSpec], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(routes.iter().map(|r| SavedRoute {
        name: r.name.clone(),
        listen: r.listen.to_string(),
        upstream: r.upstream.base_url(),
    }))
}
