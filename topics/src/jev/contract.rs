//! laya.serve 0.4.15's refusals and limits as one table.
//!
//! Every status and `detail` text the HTTP door can answer with is a row of [`Kind`], written
//! as laya.serve writes it (a Python %-format template). The door, the checks in
//! [`super::refusal`] and the tests all read this table, and a test holds it against
//! `tests/fixtures/laya-serve-0.4.15/contract.json`, so a text cannot drift in one place only
//! (STYLE.md item 12).

/// The largest body laya.serve reads (`MAX_BODY_BYTES`); one byte more is a 413.
pub const MAX_BODY_BYTES: usize = 2 * 1024 * 1024;
/// The longest state, in characters (`MAX_STATE_CHARS`).
pub const MAX_STATE_CHARS: usize = 50_000;
/// Questions per request (`MAX_QUESTIONS`).
pub const MAX_QUESTIONS: usize = 64;
/// States per batch (`MAX_BATCH_STATES`).
pub const MAX_BATCH_STATES: usize = 64;
/// Options of one choice question (`MAX_CHOICE_OPTIONS`).
pub const MAX_CHOICE_OPTIONS: usize = 100;
/// Options of one choice question when `LAYA_TOURNAMENT_GROUP` is on.
pub const MAX_TOURNAMENT_CHOICE_OPTIONS: usize = 255;
/// Levels of one score question (`MAX_SCORE_LEVELS`).
pub const MAX_SCORE_LEVELS: usize = 32;
/// Choice options plus score levels across a request (`MAX_TOTAL_OPTIONS`).
pub const MAX_TOTAL_OPTIONS: usize = 512;
/// `LAYA_MAX_TOKEN_BUDGET`'s default: the cap on `max_len` and `head_max_len`.
pub const DEFAULT_MAX_TOKEN_BUDGET: u64 = 8192;
/// `LAYA_MAX_BATCH_TOKENS`'s default.
pub const DEFAULT_MAX_BATCH_TOKENS: u64 = 131_072;
/// The row width a batch is planned with when `max_len` is not given.
pub const BATCH_ROW_TOKENS_ASSUMED: u64 = 512;
/// Values the state-length probe pops before it gives up (`_STATE_PROBE_VALUES`).
pub const STATE_PROBE_VALUES: usize = 64;
/// `LAYA_MAX_CONCURRENT`'s default.
pub const DEFAULT_MAX_CONCURRENT: usize = 16;
/// `LAYA_BODY_READ_TIMEOUT`'s default, in seconds.
pub const DEFAULT_BODY_READ_TIMEOUT_S: f64 = 10.0;
/// The `Retry-After` a 503 carries, in seconds.
pub const BUSY_RETRY_AFTER_S: u32 = 1;
/// Body fields that run inside the server and are refused when not null (`BODY_REFUSALS`).
pub const BODY_REFUSALS: [&str; 5] = ["hooks", "on_predict_start", "on_predict_end", "hooks_raise", "hooks_timeout"];
/// Batch body fields an HTTP caller cannot receive (`BATCH_BODY_OUT_PARAMETERS`).
pub const BATCH_BODY_OUT_PARAMETERS: [&str; 1] = ["diagnostics"];
/// How deep `json.loads` nests before Python's recursion limit (1000, less the server's own
/// stack) stops it. The exact depth depends on laya.serve's call stack; this stays under it.
pub const MAX_JSON_DEPTH: usize = 900;

/// One row of laya.serve's refusal table: its id in `contract.json`, status and `detail`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Unauthorized,
    Busy,
    BodyTooLarge,
    BodyTimeout,
    NotJson,
    NotAnObjectWithQuestions,
    BatchNotAnObject,
    StatesNotAList,
    TooManyStates,
    StateRequired,
    QuestionsNotAnObject,
    TooManyQuestions,
    TooManyChoiceOptions,
    TooManyScoreLevels,
    ScoreNullLevel,
    TooManyTotalOptions,
    StateTooLarge,
    ServerSideControls,
    Diagnostics,
    LoneSurrogate,
    ModelUnknownSource,
    BudgetNotInteger,
    BudgetNotPositive,
    BudgetOverLimit,
    LanguageNotString,
    MinConfidenceInvalid,
    MinConfidenceMapEmpty,
    MinConfidenceMapKey,
    BatchSizeNotInteger,
    BatchSizeNotPositive,
    SortByLengthNotBool,
    LayaValueError,
    InferenceFailed,
    NotFound,
    MethodNotAllowed,
}

impl Kind {
    /// Every row, in the order `contract.json` lists them.
    pub const ALL: [Kind; 35] = [
        Kind::Unauthorized,
        Kind::Busy,
        Kind::BodyTooLarge,
        Kind::BodyTimeout,
        Kind::NotJson,
        Kind::NotAnObjectWithQuestions,
        Kind::BatchNotAnObject,
        Kind::StatesNotAList,
        Kind::TooManyStates,
        Kind::StateRequired,
        Kind::QuestionsNotAnObject,
        Kind::TooManyQuestions,
        Kind::TooManyChoiceOptions,
        Kind::TooManyScoreLevels,
        Kind::ScoreNullLevel,
        Kind::TooManyTotalOptions,
        Kind::StateTooLarge,
        Kind::ServerSideControls,
        Kind::Diagnostics,
        Kind::LoneSurrogate,
        Kind::ModelUnknownSource,
        Kind::BudgetNotInteger,
        Kind::BudgetNotPositive,
        Kind::BudgetOverLimit,
        Kind::LanguageNotString,
        Kind::MinConfidenceInvalid,
        Kind::MinConfidenceMapEmpty,
        Kind::MinConfidenceMapKey,
        Kind::BatchSizeNotInteger,
        Kind::BatchSizeNotPositive,
        Kind::SortByLengthNotBool,
        Kind::LayaValueError,
        Kind::InferenceFailed,
        Kind::NotFound,
        Kind::MethodNotAllowed,
    ];

    /// The row: `(id in contract.json, status, detail template)`. A template uses Python's
    /// `%d` (a decimal integer), `%r` (a `repr`) and `%s` (text), filled in argument order.
    pub const fn row(self) -> (&'static str, u16, &'static str) {
        match self {
            Kind::Unauthorized => ("unauthorized", 401, "invalid or missing bearer token"),
            Kind::Busy => ("busy", 503, "server busy, try again later"),
            Kind::BodyTooLarge => ("body_too_large", 413, "request body too large"),
            Kind::BodyTimeout => ("body_timeout", 408, "request body was not received in time"),
            Kind::NotJson => ("not_json", 400, "request body must be valid JSON"),
            Kind::NotAnObjectWithQuestions => {
                ("not_an_object_with_questions", 400, "request body must be an object with a 'questions' field")
            }
            Kind::BatchNotAnObject => {
                ("batch_not_an_object", 400, "request body must be an object with 'states' and 'questions' fields")
            }
            Kind::StatesNotAList => ("states_not_a_list", 400, "'states' must be a non-empty list"),
            Kind::TooManyStates => ("too_many_states", 413, "too many states in batch (%d > %d)"),
            Kind::StateRequired => ("state_required", 400, "'state' is required"),
            Kind::QuestionsNotAnObject => ("questions_not_an_object", 400, "'questions' must be an object"),
            Kind::TooManyQuestions => ("too_many_questions", 413, "too many questions (%d > %d)"),
            Kind::TooManyChoiceOptions => ("too_many_choice_options", 413, "too many choice options for %r (%d > %d)"),
            Kind::TooManyScoreLevels => ("too_many_score_levels", 413, "too many score levels for %r (%d > %d)"),
            Kind::ScoreNullLevel => (
                "score_null_level",
                422,
                "score question %r has a null level at index %d; give every level a description",
            ),
            Kind::TooManyTotalOptions => {
                ("too_many_total_options", 413, "too many answer options across questions (%d > %d)")
            }
            Kind::StateTooLarge => ("state_too_large", 413, "state too large (%d > %d chars)"),
            Kind::ServerSideControls => (
                "server_side_controls",
                422,
                "%s run inside the server process and cannot be sent to this endpoint; install them where \
                 laya-serve runs, or drop them",
            ),
            Kind::Diagnostics => (
                "diagnostics",
                422,
                "diagnostics is filled in place for an in-process caller and cannot be returned over HTTP; read \
                 the per-group report from the CLI or a local Router",
            ),
            Kind::LoneSurrogate => (
                "lone_surrogate",
                400,
                "request body contains an unpaired surrogate escape; those cannot be encoded as UTF-8",
            ),
            Kind::ModelUnknownSource => (
                "model_unknown_source",
                422,
                "unknown model %r; choose one of %s (or an alias: %s), or omit model to let the router choose",
            ),
            Kind::BudgetNotInteger => ("budget_not_integer", 422, "%s must be an integer"),
            Kind::BudgetNotPositive => ("budget_not_positive", 422, "%s must be a positive integer"),
            Kind::BudgetOverLimit => ("budget_over_limit", 422, "%s exceeds server limit (%d > %d)"),
            Kind::LanguageNotString => {
                ("language_not_string", 422, "%s must be a language code string such as \"de\", or null")
            }
            Kind::MinConfidenceInvalid => {
                ("min_confidence_invalid", 422, "min_confidence must be a float in [0.0, 1.0], got %r")
            }
            Kind::MinConfidenceMapEmpty => (
                "min_confidence_map_empty",
                422,
                "a min_confidence map must be a non-empty dict of bucket -> float, got %r",
            ),
            Kind::MinConfidenceMapKey => (
                "min_confidence_map_key",
                422,
                "min_confidence map keys must be a bucket like 'choice:3-5' or 'default', got %r",
            ),
            Kind::BatchSizeNotInteger => ("batch_size_not_integer", 422, "batch_size must be an integer"),
            Kind::BatchSizeNotPositive => {
                ("batch_size_not_positive", 422, "batch_size must be a positive integer, got %r")
            }
            Kind::SortByLengthNotBool => ("sort_by_length_not_bool", 422, "sort_by_length must be a boolean"),
            Kind::LayaValueError => ("laya_value_error", 422, "%s"),
            Kind::InferenceFailed => ("inference_failed", 500, "inference failed"),
            Kind::NotFound => ("not_found", 404, "Not Found"),
            Kind::MethodNotAllowed => ("method_not_allowed", 405, "Method Not Allowed"),
        }
    }

    /// The id `contract.json` gives this row.
    pub const fn id(self) -> &'static str {
        self.row().0
    }

    /// The HTTP status.
    pub const fn status(self) -> u16 {
        self.row().1
    }

    /// The `detail` template.
    pub const fn template(self) -> &'static str {
        self.row().2
    }

    /// The refusal with the template's placeholders filled, in order, by `args` (already
    /// formatted: a `%d` takes the decimal text, a `%r` the `repr`). Missing arguments leave the
    /// placeholder as written; the tests make sure every call site passes enough.
    pub fn refusal(self, args: &[&str]) -> Refusal {
        let mut detail = String::new();
        let mut rest = self.template();
        let mut args = args.iter();
        while let Some(at) = rest.find('%') {
            detail.push_str(&rest[..at]);
            let spec = &rest[at..(at + 2).min(rest.len())];
            match (spec, args.next()) {
                ("%d" | "%r" | "%s", Some(arg)) => detail.push_str(arg),
                _ => detail.push_str(spec),
            }
            rest = &rest[(at + 2).min(rest.len())..];
        }
        detail.push_str(rest);
        Refusal {
            kind: self,
            status: self.status(),
            detail,
            retry_after: (self == Kind::Busy).then_some(BUSY_RETRY_AFTER_S),
        }
    }
}

/// An answer other than 200: the status, the `detail` text, and the `Retry-After` seconds a
/// 503 carries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status} {detail}")]
pub struct Refusal {
    /// The table row it came from.
    pub kind: Kind,
    pub status: u16,
    pub detail: String,
    pub retry_after: Option<u32>,
}

impl Refusal {
    /// The response body, `{"detail":"..."}`, as Starlette's `JSONResponse` writes it (compact,
    /// UTF-8, not ASCII-escaped).
    pub fn body(&self) -> String {
        let mut out = String::from("{\"detail\":");
        crate::json::write_str(&mut out, &self.detail);
        out.push('}');
        out
    }
}
