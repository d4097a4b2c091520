//! Capture.
