//! laya.serve's checks on a request body, in its order, as one pure function per route.
//!
//! [`check_single`] and [`check_batch`] take the body's bytes and give the request the model
//! will answer, or the [`Refusal`] laya.serve makes, for every check that does not need the
//! model: not JSON, the shape, the caps, the state length, the refused controls, lone
//! surrogates, the model name, and the controls' validation (`docs/http-contract.md`, rows 5 to
//! 18b). What needs the model (laya's own `ValueError` texts for a question it refuses, an
//! unknown `task`) comes after, from the agent: see [`super::render::question_refusal`].
//! Authentication, admission, the body's size and read timeout are the door's (I/O), with the
//! texts of [`Kind`].

use crate::request::Request;
use crate::value::{Integer, Map, Value};

use super::body::{self, Loaded};
use super::contract::{
    BATCH_BODY_OUT_PARAMETERS, BATCH_ROW_TOKENS_ASSUMED, BODY_REFUSALS, DEFAULT_MAX_TOKEN_BUDGET, Kind,
    MAX_BATCH_STATES, MAX_CHOICE_OPTIONS, MAX_QUESTIONS, MAX_SCORE_LEVELS, MAX_STATE_CHARS, MAX_TOTAL_OPTIONS, Refusal,
    STATE_PROBE_VALUES,
};
use crate::pyrepr::{py_str, repr, repr_str, repr_str_list};

/// The checkpoint names a server knows, for `model` (laya.serve's `_resolve_model` with its
/// Router's `resolve`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelNames {
    /// Every registered name (laya's built-ins and the extra ones), as `sorted(router.models)`.
    pub names: Vec<String>,
    /// Alias -> name (laya's `_ALIASES`).
    pub aliases: Vec<(String, String)>,
    /// Published Hub id (lower case) -> name; these pin a checkpoint although they hold a `/`.
    pub published: Vec<(String, String)>,
    /// The Hub id that means "let the router choose".
    pub bundle_repo: String,
}

impl ModelNames {
    /// laya 0.4.15's table: the three built-in checkpoints, their aliases and Hub ids, plus
    /// `extra` (the `LAYA_EXTRA_MODELS` names, such as `edge`).
    pub fn laya_0_4_15(extra: &[&str]) -> ModelNames {
        let mut names: Vec<String> =
            ["english", "multilingual", "typed-decisions"].iter().chain(extra).map(|s| s.to_string()).collect();
        names.sort();
        names.dedup();
        let pairs = |p: &[(&str, &str)]| p.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        ModelNames {
            names,
            aliases: pairs(&[
                ("en", "english"),
                ("laya", "english"),
                ("default", "english"),
                ("multi", "multilingual"),
                ("ml", "multilingual"),
                ("laya-multilingual", "multilingual"),
                ("typed", "typed-decisions"),
                ("typed_decisions", "typed-decisions"),
                ("laya-typed-decisions", "typed-decisions"),
                ("decisions", "typed-decisions"),
            ]),
            published: pairs(&[
                ("convaiinnovations/laya-multilingual", "multilingual"),
                ("convaiinnovations/laya-typed-decisions", "typed-decisions"),
            ]),
            bundle_repo: "convaiinnovations/laya".to_string(),
        }
    }

    /// `_resolve_model(body.get("model"), router.resolve)`.
    pub fn resolve(&self, model: Option<&Value>) -> Result<ModelChoice, Refusal> {
        let Some(model) = model.filter(|m| m.is_truthy()) else { return Ok(ModelChoice::Auto) };
        let raw = py_str(model);
        let text = raw.trim();
        let lower = text.to_lowercase();
        if let Some((_, name)) = self.published.iter().find(|(id, _)| *id == lower) {
            return Ok(ModelChoice::Named(name.clone()));
        }
        if lower == self.bundle_repo {
            return Ok(ModelChoice::Auto);
        }
        let key = self.aliases.iter().find(|(a, _)| *a == lower).map_or(lower.clone(), |(_, n)| n.clone());
        if self.names.contains(&key) {
            return Ok(ModelChoice::Named(key));
        }
        let path_like = text.starts_with(['.', '~']) || text.contains(['/', '\\']);
        if !path_like {
            return Ok(ModelChoice::Auto);
        }
        Err(Kind::ModelUnknownSource.refusal(&[&repr(model), &repr_str_list(&self.names), &self.sorted_aliases()]))
    }

    fn sorted_aliases(&self) -> String {
        let mut aliases: Vec<&str> = self.aliases.iter().map(|(a, _)| a.as_str()).collect();
        aliases.sort_unstable();
        repr_str_list(&aliases)
    }

    /// laya's `Router.route` for a `task` without a `model` ([`ModelChoice::Auto`]): the
    /// checkpoint it names, or laya's `ValueError` as laya.serve's 422. laya routes before it
    /// validates the questions, so this comes before the agent's own refusals.
    pub fn resolve_task(&self, task: &Value) -> Result<String, Refusal> {
        let text = py_str(task).trim().to_lowercase();
        let text = if text.replace('-', "_") == "typed_decisions" { "typed-decisions".to_string() } else { text };
        let key = self.aliases.iter().find(|(a, _)| *a == text).map_or(text.clone(), |(_, n)| n.clone());
        if self.names.contains(&key) {
            return Ok(key);
        }
        let detail = format!(
            "unknown model {}; choose one of {} (or an alias: {})",
            repr(task),
            repr_str_list(&self.names),
            self.sorted_aliases()
        );
        Err(Kind::LayaValueError.refusal(&[&detail]))
    }
}

/// What `model` named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelChoice {
    /// Absent, empty, or a name the server does not know (a Jev id such as `jev-1`): the router
    /// chooses.
    Auto,
    /// A registered checkpoint, by its canonical name.
    Named(String),
}

/// The server's settings the checks depend on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `LAYA_MAX_TOKEN_BUDGET`: the cap on `max_len` and `head_max_len`.
    pub max_token_budget: u64,
    /// Options one choice question may have: [`MAX_CHOICE_OPTIONS`], or 255 with a tournament.
    pub max_choice_options: usize,
    pub models: ModelNames,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_token_budget: DEFAULT_MAX_TOKEN_BUDGET,
            max_choice_options: MAX_CHOICE_OPTIONS,
            models: ModelNames::laya_0_4_15(&[]),
        }
    }
}

/// `min_confidence` in its validated form (`laya.confidence.check_min_confidence`).
#[derive(Debug, Clone, PartialEq)]
pub enum MinConfidence {
    /// One threshold for every answer.
    Scalar(f64),
    /// Bucket (`choice:3-5`, ..., `default`) -> threshold, in body order.
    Buckets(Vec<(String, f64)>),
}

impl MinConfidence {
    /// The validated value as a document (numbers as floats, as laya passes them on).
    pub fn to_value(&self) -> Value {
        match self {
            MinConfidence::Scalar(v) => Value::Float(*v),
            MinConfidence::Buckets(b) => Value::Object(b.iter().map(|(k, v)| (k.clone(), Value::Float(*v))).collect()),
        }
    }
}

/// The controls both routes read, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Controls {
    pub model: ModelChoice,
    pub max_len: Option<u64>,
    pub head_max_len: Option<u64>,
    /// Passed on as sent when not null; laya validates it (an unknown one is its `ValueError`).
    /// laya ignores it when `model` names a checkpoint.
    pub task: Option<Value>,
    pub lang: Option<String>,
    pub lang_guess: Option<String>,
    pub min_confidence: Option<MinConfidence>,
}

/// A `POST /v1/systemone` body that passed every check that does not need the model.
#[derive(Debug, Clone, PartialEq)]
pub struct Single {
    pub state: Value,
    pub questions: Map,
    pub controls: Controls,
}

/// A `POST /v1/systemone/batch` body that passed every check that does not need the model.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub states: Vec<Value>,
    pub questions: Map,
    pub controls: Controls,
    /// The caller's `batch_size` (≥ 1; saturated at `u64::MAX`). The server may lower it.
    pub batch_size: Option<u64>,
    pub sort_by_length: Option<bool>,
}

fn load(body: &[u8]) -> Result<Loaded, Refusal> {
    body::loads(body).map_err(|_| Kind::NotJson.refusal(&[]))
}

/// Checks a `POST /v1/systemone` body (rows 5 to 18 of `docs/http-contract.md`).
pub fn check_single(body: &[u8], settings: &Settings) -> Result<Single, Refusal> {
    let loaded = load(body)?;
    let Value::Object(map) = loaded.value else { return Err(Kind::NotAnObjectWithQuestions.refusal(&[])) };
    if !map.contains_key("questions") {
        return Err(Kind::NotAnObjectWithQuestions.refusal(&[]));
    }
    let state = map.get("state").cloned().unwrap_or(Value::Null);
    let questions = map.get("questions").cloned().unwrap_or(Value::Null);
    let questions = check_request_limits(&state, &questions, settings)?.clone();
    refuse_present(&map, &BODY_REFUSALS, Kind::ServerSideControls)?;
    if loaded.lone_surrogate {
        return Err(Kind::LoneSurrogate.refusal(&[]));
    }
    let controls = check_controls(&map, settings)?;
    Ok(Single { state, questions, controls })
}

/// Checks a `POST /v1/systemone/batch` body (rows 5 to 18b).
pub fn check_batch(body: &[u8], settings: &Settings) -> Result<Batch, Refusal> {
    let loaded = load(body)?;
    let Value::Object(map) = loaded.value else { return Err(Kind::BatchNotAnObject.refusal(&[])) };
    if !map.contains_key("questions") || !map.contains_key("states") {
        return Err(Kind::BatchNotAnObject.refusal(&[]));
    }
    let states = match map.get("states") {
        Some(Value::Array(s)) if !s.is_empty() => s.clone(),
        _ => return Err(Kind::StatesNotAList.refusal(&[])),
    };
    if states.len() > MAX_BATCH_STATES {
        return Err(Kind::TooManyStates.refusal(&[&states.len().to_string(), &MAX_BATCH_STATES.to_string()]));
    }
    let questions = map.get("questions").cloned().unwrap_or(Value::Null);
    let mut checked = None;
    for state in &states {
        checked = Some(check_request_limits(state, &questions, settings)?);
    }
    // `states` is not empty, so every state passed and the questions are an object.
    let checked = checked.cloned().unwrap_or_default();
    refuse_present(&map, &BODY_REFUSALS, Kind::ServerSideControls)?;
    refuse_present(&map, &BATCH_BODY_OUT_PARAMETERS, Kind::Diagnostics)?;
    if loaded.lone_surrogate {
        return Err(Kind::LoneSurrogate.refusal(&[]));
    }
    let controls = check_controls(&map, settings)?;
    let batch_size = match non_null(&map, "batch_size") {
        None => None,
        Some(Value::Int(i)) if is_positive(i) => Some(i.as_str().parse::<u64>().unwrap_or(u64::MAX)),
        Some(Value::Int(i)) => return Err(Kind::BatchSizeNotPositive.refusal(&[i.as_str()])),
        Some(_) => return Err(Kind::BatchSizeNotInteger.refusal(&[])),
    };
    let sort_by_length = match non_null(&map, "sort_by_length") {
        None => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(_) => return Err(Kind::SortByLengthNotBool.refusal(&[])),
    };
    Ok(Batch { states, questions: checked, controls, batch_size, sort_by_length })
}

impl Controls {
    /// The agent's request envelope for one state with these controls (`lang`, `max_len`,
    /// `head_max_len` and the validated `min_confidence`; `model`, `task` and `lang_guess` are
    /// the door's to honour, and `id` and `deadline_ms` its to set).
    pub fn request(&self, state: Value, questions: Map) -> Request {
        let int = |v: Option<u64>| v.map(|v| i64::try_from(v).unwrap_or(i64::MAX));
        Request {
            id: None,
            state,
            questions,
            lang: self.lang.clone(),
            max_len: int(self.max_len),
            head_max_len: int(self.head_max_len),
            deadline_ms: None,
            min_confidence: self.min_confidence.as_ref().map(MinConfidence::to_value),
        }
    }
}

impl Single {
    /// The agent's request for this body (see [`Controls::request`]).
    pub fn request(&self) -> Request {
        self.controls.request(self.state.clone(), self.questions.clone())
    }
}

impl Batch {
    /// One agent request per state, in order (see [`Controls::request`]).
    pub fn requests(&self) -> Vec<Request> {
        self.states.iter().map(|s| self.controls.request(s.clone(), self.questions.clone())).collect()
    }

    /// The `batch_size` laya.serve passes to `predict_batch` (`_batch_chunk_size`, then the
    /// smaller of it and the caller's): `None` when the batch fits `max_batch_tokens`
    /// (`LAYA_MAX_BATCH_TOKENS`) in one pass and the caller set none.
    pub fn planned_batch_size(&self, max_batch_tokens: u64) -> Option<u64> {
        let n_states = self.states.len() as u64;
        let n_questions = self.questions.len() as u64;
        let planned = if n_states == 0 || n_questions == 0 {
            None
        } else {
            let width = self.controls.max_len.unwrap_or(BATCH_ROW_TOKENS_ASSUMED).max(1);
            if n_states.saturating_mul(n_questions).saturating_mul(width) <= max_batch_tokens {
                None
            } else {
                let rows_per_pass = (max_batch_tokens / width).max(1);
                Some(n_states.min(rows_per_pass / n_questions).max(1))
            }
        };
        match (self.batch_size, planned) {
            (Some(asked), Some(planned)) => Some(asked.min(planned)),
            (asked, planned) => asked.or(planned),
        }
    }
}

fn non_null<'a>(map: &'a Map, key: &str) -> Option<&'a Value> {
    map.get(key).filter(|v| **v != Value::Null)
}

fn is_positive(i: &Integer) -> bool {
    !i.as_str().starts_with('-') && i.as_str() != "0"
}

/// `_refuse_body_refusals` / `_refuse_out_parameters`: the named fields present and not null,
/// sorted, joined with `, `.
fn refuse_present(map: &Map, keys: &[&str], kind: Kind) -> Result<(), Refusal> {
    let mut given: Vec<&str> = keys.iter().copied().filter(|k| non_null(map, k).is_some()).collect();
    if given.is_empty() {
        return Ok(());
    }
    given.sort_unstable();
    Err(kind.refusal(&[&given.join(", ")]))
}

/// `_check_request_limits`: the state is there, the questions are an object within the caps,
/// the state is not too long. Returns the questions.
fn check_request_limits<'a>(state: &Value, questions: &'a Value, settings: &Settings) -> Result<&'a Map, Refusal> {
    if *state == Value::Null {
        return Err(Kind::StateRequired.refusal(&[]));
    }
    let Value::Object(questions) = questions else { return Err(Kind::QuestionsNotAnObject.refusal(&[])) };
    if questions.len() > MAX_QUESTIONS {
        return Err(Kind::TooManyQuestions.refusal(&[&questions.len().to_string(), &MAX_QUESTIONS.to_string()]));
    }
    let mut total = 0usize;
    for (qid, question) in questions {
        let Value::Object(q) = question else { continue };
        let qtype = q.get("type").and_then(Value::as_str);
        let count = match (qtype, q.get("criteria")) {
            (Some("choice"), Some(Value::Object(c))) => Some((c.len(), None)),
            (Some("choice"), Some(Value::Array(c))) => Some((c.len(), None)),
            (Some("score"), Some(Value::Array(c))) => Some((c.len(), Some(c))),
            _ => None,
        };
        let Some((count, levels)) = count else { continue };
        total += count;
        match levels {
            None if count > settings.max_choice_options => {
                return Err(Kind::TooManyChoiceOptions.refusal(&[
                    &repr_str(qid),
                    &count.to_string(),
                    &settings.max_choice_options.to_string(),
                ]));
            }
            Some(_) if count > MAX_SCORE_LEVELS => {
                return Err(Kind::TooManyScoreLevels.refusal(&[
                    &repr_str(qid),
                    &count.to_string(),
                    &MAX_SCORE_LEVELS.to_string(),
                ]));
            }
            Some(levels) => {
                if let Some(at) = levels.iter().position(|l| *l == Value::Null) {
                    return Err(Kind::ScoreNullLevel.refusal(&[&repr_str(qid), &at.to_string()]));
                }
            }
            None => {}
        }
    }
    if total > MAX_TOTAL_OPTIONS {
        return Err(Kind::TooManyTotalOptions.refusal(&[&total.to_string(), &MAX_TOTAL_OPTIONS.to_string()]));
    }
    let len = state_length(state);
    if len > MAX_STATE_CHARS {
        return Err(Kind::StateTooLarge.refusal(&[&len.to_string(), &MAX_STATE_CHARS.to_string()]));
    }
    Ok(questions)
}

/// `_state_length`: the number laya.serve compares with [`MAX_STATE_CHARS`] and reports.
///
/// A string counts its code points. Anything else first gets the cheap lower bound (at most
/// [`STATE_PROBE_VALUES`] values popped, string lengths summed, returned once past the cap);
/// failing that, the length of `json.dumps(state, ensure_ascii=False)`.
pub fn state_length(state: &Value) -> usize {
    if let Value::Str(s) = state {
        return s.chars().count();
    }
    let over = state_length_lower_bound_over(state, MAX_STATE_CHARS);
    if over > 0 {
        return over;
    }
    crate::json::to_string(state, crate::json::Style::PYTHON).chars().count()
}

/// `_state_length_lower_bound_over`: a total past `cap`, or 0 for no verdict.
fn state_length_lower_bound_over(state: &Value, cap: usize) -> usize {
    let mut total = 0usize;
    let mut budget = STATE_PROBE_VALUES;
    let mut stack: Vec<&Value> = vec![state];
    while budget > 0 {
        let Some(item) = stack.pop() else { break };
        budget -= 1;
        match item {
            Value::Str(s) => {
                total += s.chars().count();
                if total > cap {
                    return total;
                }
            }
            Value::Object(m) => stack.extend(m.values()),
            Value::Array(a) => stack.extend(a.iter()),
            _ => return 0,
        }
    }
    0
}

/// Rows 15 to 18: `model`, `max_len`, `head_max_len`, `lang`, `lang_guess`, `min_confidence`.
fn check_controls(map: &Map, settings: &Settings) -> Result<Controls, Refusal> {
    let model = settings.models.resolve(map.get("model"))?;
    let max_len = check_budget(map, "max_len", settings.max_token_budget)?;
    let head_max_len = check_budget(map, "head_max_len", settings.max_token_budget)?;
    let task = non_null(map, "task").cloned();
    let lang = check_language(map, "lang")?;
    let lang_guess = check_language(map, "lang_guess")?;
    let min_confidence = non_null(map, "min_confidence").map(check_min_confidence).transpose()?;
    Ok(Controls { model, max_len, head_max_len, task, lang, lang_guess, min_confidence })
}

/// `_validate_budget_param`.
fn check_budget(map: &Map, key: &str, cap: u64) -> Result<Option<u64>, Refusal> {
    match non_null(map, key) {
        None => Ok(None),
        Some(Value::Int(i)) if !is_positive(i) => Err(Kind::BudgetNotPositive.refusal(&[key])),
        Some(Value::Int(i)) => match i.as_str().parse::<u64>() {
            Ok(v) if v <= cap => Ok(Some(v)),
            _ => Err(Kind::BudgetOverLimit.refusal(&[key, i.as_str(), &cap.to_string()])),
        },
        Some(_) => Err(Kind::BudgetNotInteger.refusal(&[key])),
    }
}

/// `_validate_language_param`.
fn check_language(map: &Map, key: &str) -> Result<Option<String>, Refusal> {
    match non_null(map, key) {
        None => Ok(None),
        Some(Value::Str(s)) => Ok(Some(s.clone())),
        Some(_) => Err(Kind::LanguageNotString.refusal(&[key])),
    }
}

/// The buckets a `min_confidence` map may name (`laya.confidence.bucket_keys()` and `default`).
pub fn min_confidence_buckets() -> Vec<String> {
    let mut keys: Vec<String> = ["choice", "score", "noul"]
        .iter()
        .flat_map(|t| ["2", "3-5", "6-10", "11+"].iter().map(move |s| format!("{t}:{s}")))
        .collect();
    keys.push("default".to_string());
    keys
}

/// `laya.confidence.check_min_confidence`.
fn check_min_confidence(v: &Value) -> Result<MinConfidence, Refusal> {
    let Value::Object(m) = v else { return check_threshold(v).map(MinConfidence::Scalar) };
    if m.is_empty() {
        return Err(Kind::MinConfidenceMapEmpty.refusal(&[&repr(v)]));
    }
    let allowed = min_confidence_buckets();
    let mut out = Vec::with_capacity(m.len());
    for (key, val) in m {
        if !allowed.contains(key) {
            return Err(Kind::MinConfidenceMapKey.refusal(&[&repr_str(key)]));
        }
        out.push((key.clone(), check_threshold(val)?));
    }
    Ok(MinConfidence::Buckets(out))
}

/// `_check_one_threshold`: a real number in [0, 1], not a boolean. (An integer too large for a
/// float makes laya raise `OverflowError`, an unhandled 500; here it is out of range.)
fn check_threshold(v: &Value) -> Result<f64, Refusal> {
    let x = match v {
        Value::Float(f) => Some(*f),
        Value::Int(i) => Some(i.to_f64()),
        _ => None,
    };
    match x {
        Some(x) if x.is_finite() && (0.0..=1.0).contains(&x) => Ok(x),
        _ => Err(Kind::MinConfidenceInvalid.refusal(&[&repr(v)])),
    }
}
