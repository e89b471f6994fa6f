//! The web dashboard's files, embedded in the binary at compile time.
//!
//! Embedding (rather than reading `ui/` at run time) keeps `speedtap` a single
//! file that serves the same page wherever it is installed, and means no path
//! from a request ever reaches the file system: only the names listed here
//! exist. A new file under `ui/` is served once it is added to [`ASSETS`]
//! (`ui/test/assets.test.mjs` fails when a served file is missing here; the
//! tests below fail when a listed page or module imports a file that isn't).
//!
//! Only what the page loads is listed: `ui/` also holds the UI's tests, its
//! `package.json` and `node_modules`, which must never be served.

/// One embedded file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Asset {
    /// The URL path it answers, e.g. `/app.js`.
    pub path: &'static str,
    pub content_type: &'static str,
    pub body: &'static [u8],
}

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const SVG: &str = "image/svg+xml";

/// `ui!("lib/format.js", JS)`: the file `ui/lib/format.js`, served at
/// `/lib/format.js`.
macro_rules! ui {
    ($file:literal, $content_type:expr) => {
        Asset {
            path: concat!("/", $file),
            content_type: $content_type,
            body: include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/ui/", $file)),
        }
    };
}

const INDEX: &[u8] = include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/ui/index.html"));

/// Every file the dashboard serves. `/` is the same page as `/index.html`.
pub const ASSETS: &[Asset] = &[
    Asset {
        path: "/",
        content_type: HTML,
        body: INDEX,
    },
    ui!("index.html", HTML),
    ui!("app.js", JS),
    ui!("style.css", CSS),
    ui!("favicon.svg", SVG),
    ui!("lib/capture.js", JS),
    ui!("lib/chart.js", JS),
    ui!("lib/clients.js", JS),
    ui!("lib/datasource.js", JS),
    ui!("lib/details.js", JS),
    ui!("lib/format.js", JS),
    ui!("lib/history.js", JS),
    ui!("lib/present.js", JS),
    ui!("lib/reducer.js", JS),
    ui!("lib/servers.js", JS),
    ui!("lib/settings.js", JS),
    ui!("lib/sparkline.js", JS),
    ui!("lib/table.js", JS),
    ui!("lib/views.js", JS),
    ui!("views/calls.js", JS),
    ui!("views/capture.js", JS),
    ui!("views/chart.js", JS),
    ui!("views/details.js", JS),
    ui!("views/dom.js", JS),
    ui!("views/global.js", JS),
    ui!("views/history.js", JS),
    ui!("views/historychart.js", JS),
    ui!("views/settings.js", JS),
    ui!("views/sort.js", JS),
    ui!("views/start.js", JS),
    // uPlot, copied byte for byte from its npm package by
    // `ui/scripts/vendor.mjs` (checked by `ui/test/vendor.test.mjs`).
    ui!("vendor/uPlot.esm.js", JS),
    ui!("vendor/uPlot.min.css", CSS),
];

/// The embedded file at `path`, if any.
pub fn asset(path: &str) -> Option<&'static Asset> {
    ASSETS.iter().find(|a| a.path == path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_is_html_with_a_speedtap_title() {
        let index = asset("/").unwrap();
        assert_eq!(index.content_type, HTML);
        let text = std::str::from_utf8(index.body).unwrap();
        let title = text
            .split("<title>")
            .nth(1)
            .unwrap()
            .split("</title>")
            .next()
            .unwrap();
        assert!(title.to_lowercase().contains("speedtap"), "{title}");
        assert!(text.contains(r#"<script type="module" src="app.js">"#));
        assert_eq!(asset("/index.html").unwrap().body, index.body);
    }

    #[test]
    fn types_follow_the_extension_and_unknown_names_are_not_served() {
        assert_eq!(asset("/app.js").unwrap().content_type, JS);
        assert_eq!(asset("/style.css").unwrap().content_type, CSS);
        assert_eq!(asset("/vendor/uPlot.esm.js").unwrap().content_type, JS);
        for a in ASSETS {
            let expected = match a.path.rsplit('.').next() {
                Some("js") => JS,
                Some("css") => CSS,
                Some("svg") => SVG,
                _ => HTML,
            };
            assert_eq!(a.content_type, expected, "{}", a.path);
        }
        for path in [
            "/../Cargo.toml",
            "/package.json",
            "/package-lock.json",
            "/node_modules/uplot/dist/uPlot.esm.js",
            "/test/format.test.mjs",
            "/scripts/vendor.mjs",
        ] {
            assert!(asset(path).is_none(), "{path}");
        }
    }

    /// Joins a relative reference onto the directory of `from` (both URL
    /// paths), resolving `.` and `..`.
    fn resolve(from: &str, reference: &str) -> String {
        let mut parts: Vec<&str> = from.split('/').collect();
        parts.pop();
        for seg in reference.split('/') {
            match seg {
                "." | "" => {}
                ".." => {
                    parts.pop();
                }
                s => parts.push(s),
            }
        }
        if parts.first() != Some(&"") {
            parts.insert(0, "");
        }
        parts.join("/")
    }

    /// The quoted text after each occurrence of `marker`.
    fn quoted_after<'a>(text: &'a str, marker: &str) -> Vec<&'a str> {
        text.match_indices(marker)
            .filter_map(|(i, _)| {
                let rest = &text[i + marker.len()..];
                let quote = rest.chars().next()?;
                if quote != '"' && quote != '\'' {
                    return None;
                }
                rest[1..].split(quote).next()
            })
            .collect()
    }

    #[test]
    fn every_file_the_page_and_its_modules_load_is_embedded() {
        let mut checked = 0;
        for a in ASSETS {
            let text = std::str::from_utf8(a.body).unwrap();
            let refs: Vec<&str> = match a.content_type {
                JS => [quoted_after(text, "from "), quoted_after(text, "import ")].concat(),
                HTML => [quoted_after(text, "src="), quoted_after(text, "href=")].concat(),
                _ => Vec::new(),
            };
            for r in refs {
                if r.starts_with('#') || r.contains("://") || r.is_empty() {
                    continue;
                }
                let target = resolve(if a.path == "/" { "/index.html" } else { a.path }, r);
                assert!(
                    asset(&target).is_some(),
                    "{} loads {r} ({target}), which is not in ASSETS",
                    a.path
                );
                checked += 1;
            }
        }
        // index.html alone loads four files; the modules import many more.
        assert!(checked > 20, "only {checked} references found");
    }

    #[test]
    fn resolve_handles_dot_segments() {
        assert_eq!(
            resolve("/views/calls.js", "../lib/format.js"),
            "/lib/format.js"
        );
        assert_eq!(resolve("/views/calls.js", "./dom.js"), "/views/dom.js");
        assert_eq!(
            resolve("/index.html", "vendor/uPlot.min.css"),
            "/vendor/uPlot.min.css"
        );
    }
}
