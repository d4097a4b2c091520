//! Writing a recording (being written by the lead).

/// Appends records to a recording file.
pub struct Writer;
