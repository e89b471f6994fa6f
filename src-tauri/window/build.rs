//! Tauri's build step, with the app's one command (`app`, the window's
//! questions to the tray process) declared, so that a capability can grant
//! it to the window's page, which Tauri counts as a remote origin.

fn main() {
    let attributes = tauri_build::Attributes::new()
        .app_manifest(tauri_build::AppManifest::new().commands(&["app"]));
    if let Err(e) = tauri_build::try_build(attributes) {
        panic!("tauri build step: {e:#}");
    }
}
