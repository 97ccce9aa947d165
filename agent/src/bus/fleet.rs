//! The fleet view (filled in by the next commit).
