//! The window's size and position, remembered across openings and restarts
//! in a small file beside the config file in use (`window.json`, logical
//! pixels; so each `--config` has its own), so
//! the window comes back where the user left it. A file that is missing,
//! unreadable or holds a size below the window's minimum is ignored: the
//! window then opens at its default size, placed by the window manager.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The window's size when nothing is remembered (logical pixels).
pub const DEFAULT_SIZE: (f64, f64) = (1180.0, 760.0);
/// The smallest size the window can be made (logical pixels).
pub const MIN_SIZE: (f64, f64) = (640.0, 420.0);

/// Where the window was: inner size and outer position, logical pixels.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Geometry {
    pub width: f64,
    pub height: f64,
    pub x: f64,
    pub y: f64,
}

impl Geometry {
    /// The geometry when it can be applied as is: finite numbers and a
    /// size at least the minimum.
    fn usable(self) -> Option<Self> {
        let finite = [self.width, self.height, self.x, self.y]
            .iter()
            .all(|n| n.is_finite());
        (finite && self.width >= MIN_SIZE.0 && self.height >= MIN_SIZE.1).then_some(self)
    }
}

/// `window.json` in the folder of `config`, the config file the tray app
/// was started with (the default config file's when `None`).
pub fn path_beside(config: Option<&Path>) -> PathBuf {
    config
        .map(Path::to_path_buf)
        .unwrap_or_else(speedtap::config::default_config_path)
        .with_file_name("window.json")
}

/// The remembered geometry at `path`, if there is a usable one.
pub fn load(path: &Path) -> Option<Geometry> {
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_str::<Geometry>(&text).ok()?.usable()
}

/// Remembers `geometry` at `path` (written beside it, then renamed, so a
/// crash never leaves half a file). An unusable geometry is not written.
pub fn save(path: &Path, geometry: Geometry) -> std::io::Result<()> {
    let Some(geometry) = geometry.usable() else {
        return Ok(());
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let text = serde_json::to_string(&geometry).map_err(std::io::Error::other)?;
    let partial = path.with_extension("json.partial");
    std::fs::write(&partial, text)?;
    std::fs::rename(&partial, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("speedtap-window-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir.join("speedtap").join("window.json")
    }

    #[test]
    fn the_window_is_remembered_beside_the_config_file_it_was_started_with() {
        let config = Path::new("/home/u/work/speedtap-test.toml");
        assert_eq!(
            path_beside(Some(config)),
            Path::new("/home/u/work/window.json")
        );
        assert_eq!(
            path_beside(None),
            speedtap::config::default_config_path().with_file_name("window.json")
        );
    }

    #[test]
    fn a_saved_size_and_position_come_back_as_they_were() {
        let path = scratch("round-trip");
        let g = Geometry {
            width: 900.0,
            height: 640.5,
            x: -20.0,
            y: 35.0,
        };
        save(&path, g).unwrap();
        assert_eq!(load(&path), Some(g));
    }

    #[test]
    fn a_missing_file_a_broken_one_or_a_size_below_the_minimum_opens_at_the_default() {
        let path = scratch("unusable");
        assert_eq!(load(&path), None);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, "{\"width\": 900").unwrap();
        assert_eq!(load(&path), None);
        std::fs::write(&path, r#"{"width":300,"height":200,"x":0,"y":0}"#).unwrap();
        assert_eq!(load(&path), None);
        // An unusable geometry is not written over a good one.
        let good = Geometry {
            width: 800.0,
            height: 600.0,
            x: 10.0,
            y: 10.0,
        };
        save(&path, good).unwrap();
        save(
            &path,
            Geometry {
                width: f64::NAN,
                ..good
            },
        )
        .unwrap();
        assert_eq!(load(&path), Some(good));
    }
}
