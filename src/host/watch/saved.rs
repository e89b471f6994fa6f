//! The servers found, saved between runs (`servers.json` beside the
//! store), so a server keeps its name (and with it its history,
//! calibration and normals) whatever else starts before it next time.
//!
//! A file and not a table of the store: names must hold with `--no-db`
//! too, and the list is a few lines rewritten only when a server comes or
//! goes. It is written to a temporary file and renamed, so a crash leaves
//! the old list or the new one, never half of one.

use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::discover::registry::KnownServer;

/// The file's shape; `version` lets a later speedtap read an older file.
#[derive(Serialize, Deserialize)]
struct SavedServers {
    version: u32,
    servers: Vec<KnownServer>,
}

const VERSION: u32 = 1;

/// The servers saved at `path`: none when there is no file yet. A file
/// that can't be read as a list is an error naming it (the caller warns
/// and starts afresh; the file is replaced at the next save).
pub(crate) fn load(path: &Path) -> Result<Vec<KnownServer>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let saved: SavedServers = serde_json::from_str(&text)
        .map_err(|e| format!("{} is not a list of servers: {e}", path.display()))?;
    Ok(saved.servers)
}

/// Saves `servers` at `path`, through a temporary file in the same folder.
pub(crate) fn save(path: &Path, servers: &[KnownServer]) -> io::Result<()> {
    let saved = SavedServers {
        version: VERSION,
        servers: servers.to_vec(),
    };
    let text = serde_json::to_string_pretty(&saved).map_err(io::Error::other)?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discover::registry::tests::id;
    use crate::discover::registry::Registry;
    use std::collections::BTreeSet;
    use std::time::{Duration, SystemTime};

    #[test]
    fn saved_names_hold_across_restarts_whatever_order_servers_come_back_in() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("servers.json");
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut first = Registry::new(load(&path).unwrap(), BTreeSet::new());
        first.up(id("ollama", 8080), Some(11434), t);
        first.up(id("ollama", 11434), Some(11434), t);
        save(&path, first.servers()).unwrap();

        let mut second = Registry::new(load(&path).unwrap(), BTreeSet::new());
        let back_11434 = second.up(id("ollama", 11434), Some(11434), t);
        let back_8080 = second.up(id("ollama", 8080), Some(11434), t);
        let names = |a: &crate::discover::registry::Arrival| format!("{a:?}");
        assert_eq!(names(&back_11434), r#"Back { name: "ollama" }"#);
        assert_eq!(names(&back_8080), r#"Back { name: "ollama-8080" }"#);
    }

    #[test]
    fn no_file_is_no_server_and_a_broken_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("servers.json");
        assert_eq!(load(&path).unwrap(), Vec::new());
        std::fs::write(&path, "{not json").unwrap();
        let err = load(&path).unwrap_err();
        assert!(err.contains("servers.json"), "{err}");
    }
}
