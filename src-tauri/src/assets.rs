//! The window's web files: the very table the control API serves at `/`
//! ([`speedtap::api::dashboard::ASSETS`]), so the window and the browser
//! load the same bytes of the one UI in `ui/`.
//!
//! Why not `frontendDist: "../ui"`: Tauri embeds *every* file under that
//! folder, and `ui/` also holds the UI's `node_modules/` (Playwright, for
//! its own tests), its tests and their output. That would put megabytes of
//! test tooling into the tray binary and rebuild it whenever a browser test
//! writes a screenshot. The dashboard's list names exactly the files the
//! page needs, and is already compiled into the core library.

use std::borrow::Cow;

use speedtap::api::dashboard::ASSETS;
use tauri::utils::assets::{AssetKey, AssetsIter, CspHash};
use tauri::{Assets, Runtime};

/// The dashboard's embedded files as Tauri assets.
pub struct UiAssets;

impl<R: Runtime> Assets<R> for UiAssets {
    fn get(&self, key: &AssetKey) -> Option<Cow<'_, [u8]>> {
        // Tauri asks for `/index.html` for the root and falls back to it for
        // unknown paths; keys always start with `/`, like the table's paths.
        speedtap::api::dashboard::asset(key.as_ref()).map(|a| Cow::Borrowed(a.body))
    }

    fn iter(&self) -> Box<AssetsIter<'_>> {
        Box::new(
            ASSETS
                .iter()
                .map(|a| (Cow::Borrowed(a.path), Cow::Borrowed(a.body))),
        )
    }

    fn csp_hashes(&self, _html_path: &AssetKey) -> Box<dyn Iterator<Item = CspHash<'_>> + '_> {
        // No CSP is configured (`app.security.csp` is null), so no hashes.
        Box::new(std::iter::empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tauri::test::MockRuntime;

    #[test]
    fn serves_the_dashboards_index_and_nothing_from_node_modules() {
        let assets = UiAssets;
        let index = <UiAssets as Assets<MockRuntime>>::get(&assets, &AssetKey::from("index.html"))
            .expect("index.html is served");
        assert!(String::from_utf8_lossy(&index).contains("<title>"));
        let keys: Vec<String> = <UiAssets as Assets<MockRuntime>>::iter(&assets)
            .map(|(k, _)| k.into_owned())
            .collect();
        assert!(keys.iter().all(|k| !k.contains("node_modules")), "{keys:?}");
        assert!(keys.iter().any(|k| k == "/index.html"), "{keys:?}");
    }
}
