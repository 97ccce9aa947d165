//! Python's `repr()` for laya's own error messages: laya-topics' (`laya_topics::pyrepr`), where
//! the HTTP contract's `detail` texts use it too.

pub use laya_topics::pyrepr::{repr, repr_str, repr_str_list};
