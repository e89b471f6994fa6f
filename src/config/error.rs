//! What a bad config file or flag is told: one error type whose every
//! variant names where to fix it (the file and line, or the flag), and
//! means exit code 2 (`docs/api.md`).

/// A bad config file or flag. Every variant means exit code 2.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{file}: {source}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
    /// A problem at a known line: syntax, unknown key, wrong type, or a
    /// semantic check.
    #[error("{file} line {line}: {message}")]
    AtLine {
        file: String,
        line: usize,
        message: String,
    },
    /// A problem the TOML parser could not place (rare).
    #[error("{file}: {message}")]
    InFile { file: String, message: String },
    /// A problem with a command-line flag, e.g. `--route ollama: ...`.
    #[error("{flag}: {message}")]
    Flag { flag: String, message: String },
}

impl ConfigError {
    /// The 1-based line, for errors that have one.
    pub fn line(&self) -> Option<usize> {
        match self {
            ConfigError::AtLine { line, .. } => Some(*line),
            _ => None,
        }
    }
}

/// 1-based line of a byte offset.
pub(super) fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    1 + text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_of_counts_from_one() {
        let t = "a\nb\nc";
        assert_eq!(line_of(t, 0), 1);
        assert_eq!(line_of(t, 2), 2);
        assert_eq!(line_of(t, 4), 3);
        assert_eq!(line_of(t, 100), 3);
    }
}
