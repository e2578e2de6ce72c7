//! JSON decoding errors as they may be shown: their category and position, never the input
//! (which may be a Secret's content, or a review's).

/// Where and how a JSON input failed to decode: a fixed category and a position. It holds
/// nothing of the input, so it can go into any message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorPlace {
    what: &'static str,
    line: usize,
    column: usize,
}

impl ErrorPlace {
    pub fn of(e: &serde_json::Error) -> Self {
        let what = match e.classify() {
            serde_json::error::Category::Io => "could not be read",
            serde_json::error::Category::Syntax => "is not valid JSON",
            serde_json::error::Category::Data => "has a field of the wrong type or value",
            serde_json::error::Category::Eof => "ends early",
        };
        ErrorPlace {
            what,
            line: e.line(),
            column: e.column(),
        }
    }
}

impl std::fmt::Display for ErrorPlace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ErrorPlace { what, line, column } = self;
        write!(f, "the JSON {what} (line {line}, column {column})")
    }
}

/// A JSON decoding error: its category and position only.
pub fn error_text(e: &serde_json::Error) -> String {
    ErrorPlace::of(e).to_string()
}
