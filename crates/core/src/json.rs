//! JSON decoding errors as they may be shown: their category and position, never the input
//! (which may be a Secret's content, or a review's).

/// A JSON decoding error: its category and position only.
pub fn error_text(e: &serde_json::Error) -> String {
    let what = match e.classify() {
        serde_json::error::Category::Io => "could not be read",
        serde_json::error::Category::Syntax => "is not valid JSON",
        serde_json::error::Category::Data => "has a field of the wrong type or value",
        serde_json::error::Category::Eof => "ends early",
    };
    format!("the JSON {what} (line {}, column {})", e.line(), e.column())
}
