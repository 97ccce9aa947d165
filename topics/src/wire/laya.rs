//! Which laya a model is answered as: the version whose semantics (validation, token layout,
//! answers, `usage`) laya-edge reproduces for it. Chosen per model (`[model] laya`, `--laya`) and
//! reported in the status document, so a client knows which `laya.Agent` to compare with.

wire_names! {
    /// The laya version whose semantics a model is served with.
    ///
    /// ```
    /// use laya_topics::wire::LayaVersion;
    /// for v in LayaVersion::ALL {
    ///     assert_eq!(v.to_string().parse::<LayaVersion>(), Ok(*v));
    /// }
    /// assert_eq!(LayaVersion::default(), LayaVersion::V0_3_20);
    /// assert!("0.4".parse::<LayaVersion>().is_err());
    /// ```
    #[derive(Default)]
    pub enum LayaVersion ("laya version") {
        /// laya 0.3.20, the version the published graphs were exported with (the default).
        #[default]
        V0_3_20 = "0.3.20",
        /// laya 0.4.15: `usage` with truncation figures, `option_order`, `min_confidence`,
        /// stricter validation, `calibration.json`, the parallel option layout.
        V0_4_15 = "0.4.15",
    }
}

impl LayaVersion {
    /// Whether this version has laya 0.4's features (everything [`LayaVersion::V0_4_15`] lists).
    pub fn is_0_4(self) -> bool {
        matches!(self, LayaVersion::V0_4_15)
    }
}
