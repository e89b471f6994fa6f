//! The web dashboard's files, embedded in the binary at compile time.
//!
//! Embedding (rather than reading `ui/` at run time) keeps `speedtap` a single
//! file that serves the same page wherever it is installed, and means no path
//! from a request ever reaches the file system: only the names listed here
//! exist. A new file under `ui/` is served once it is added to [`ASSETS`].

/// One embedded file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Asset {
    /// The URL path it answers, e.g. `/app.js`.
    pub path: &'static str,
    pub content_type: &'static str,
    pub body: &'static [u8],
}

const INDEX: &[u8] = include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/ui/index.html"));
const APP_JS: &[u8] = include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/ui/app.js"));

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";

/// Every file the dashboard serves. `/` is the same page as `/index.html`.
pub const ASSETS: &[Asset] = &[
    Asset {
        path: "/",
        content_type: HTML,
        body: INDEX,
    },
    Asset {
        path: "/index.html",
        content_type: HTML,
        body: INDEX,
    },
    Asset {
        path: "/app.js",
        content_type: JS,
        body: APP_JS,
    },
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
        assert!(text.contains("app.js"));
        assert_eq!(asset("/index.html").unwrap().body, index.body);
    }

    #[test]
    fn script_is_served_as_javascript_and_unknown_names_are_not() {
        assert_eq!(asset("/app.js").unwrap().content_type, JS);
        assert!(asset("/../Cargo.toml").is_none());
        assert!(asset("/style.css").is_none());
    }
}
