//! The token layout: laya's `build_sequence`.
//!
//! `[CLS] "<type> question: <instructions>" [SEP] ([MASK] " <option>")* [SEP] <state> [SEP]`,
//! with laya's budget rules: options capped at 48 tokens, cut further when they leave fewer than
//! 16 tokens of `head_max_len` for the instructions, the state cut to what is left of `max_len`
//! (from the left for a conversation list, so the newest turns stay), and the mask token's text
//! replaced by a space in everything the caller wrote.

use laya_topics::wire::LayaVersion;
use laya_topics::{Value, json};

use super::parallel::ParallelLayout;
use super::pyrepr::repr_str;
use super::question::{QType, Question, QuestionError, QuestionErrorKind};
use super::render::render_options;
use super::tokenizer::{Tokenizer, TokenizerError};

/// An option's text is cut to this many tokens before anything else.
pub const OPTION_TOKEN_CAP: usize = 48;

/// The token budget of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest sequence, all parts included.
    pub max_len: i64,
    /// Budget of the head: the instructions and all options together.
    pub head_max_len: i64,
}

impl Default for Limits {
    /// laya's defaults when a checkpoint's config names none.
    fn default() -> Self {
        Limits { max_len: 512, head_max_len: 192 }
    }
}

/// How a checkpoint lays its options out (`option_layout` in `rl_agent_config.json`, laya 0.4.15).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OptionLayout {
    /// One after another, each attending to all (every published checkpoint).
    #[default]
    Sequential,
    /// All starting at one position, none attending to another (`laya-train`'s parallel layout).
    Parallel,
}

/// What laying a row out did to its budget: laya 0.4.15's `build_sequence` statistics, from
/// which a reply's `usage` is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LayoutStats {
    /// The state's tokens before the cut.
    pub state_tokens: usize,
    /// How many of them did not fit.
    pub state_tokens_dropped: usize,
    /// The options the question defines.
    pub options: usize,
    /// How many of them still have a token span of their own after the head budget's cut.
    pub options_distinct: usize,
    /// The cut applied to every option, if one was.
    pub tokens_per_option: Option<usize>,
}

impl LayoutStats {
    /// Whether the state lost tokens.
    pub fn truncated(&self) -> bool {
        self.state_tokens_dropped > 0
    }
}

/// One question's row: what the model is asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub input_ids: Vec<u32>,
    /// Index of each option's `[MASK]` in `input_ids`, in slot order: option order, or the
    /// question's `option_order` (slot `s` holds option `order[s]`).
    pub marker_pos: Vec<u32>,
    pub qtype: QType,
    /// The parallel option layout of a checkpoint with `option_layout: "parallel"`
    /// ([`super::parallel`]); `None`: the sequential layout (positions `0..len`, every token
    /// attending to every other).
    pub layout: Option<ParallelLayout>,
}

/// The state, tokenized once for all questions of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedState {
    pub ids: Vec<u32>,
    /// A conversation (list) state loses its oldest tokens when cut, other states their newest.
    pub truncate_left: bool,
}

/// laya's `serialize_state`: strings as they are, anything else as `json.dumps(ensure_ascii=False)`.
pub fn serialize_state(state: &Value) -> String {
    match state {
        Value::Str(s) => s.clone(),
        other => json::to_string(other, json::Style::PYTHON),
    }
}

/// Tokenizes the state once (mask token text replaced by a space).
pub fn encode_state(tok: &Tokenizer, state: &Value) -> Result<EncodedState, TokenizerError> {
    let text = serialize_state(state).replace(&tok.mask.text, " ");
    Ok(EncodedState { ids: tok.encode(&text)?, truncate_left: matches!(state, Value::Array(_)) })
}

/// Python's `seq[:end]` length for a sequence of `len` items.
fn py_slice_end(len: usize, end: i64) -> usize {
    if end < 0 { len.saturating_sub(end.unsigned_abs() as usize) } else { len.min(end as usize) }
}

/// laya's `build_sequence` for one question, plus `_encode_state`'s check that every option's
/// marker fits (its message is `laya`'s version's), with what the budget did to the row; laid
/// out in parallel ([`super::parallel`]) for a checkpoint whose options are.
pub fn build_row(
    tok: &Tokenizer,
    qid: &str,
    q: &Question,
    state: &EncodedState,
    limits: Limits,
    laya: LayaVersion,
    layout: OptionLayout,
) -> Result<(Row, LayoutStats), LayoutError> {
    let mask = tok.mask.text.as_str();
    let options = render_options(q);
    let instructions = q.instructions.replace(mask, " ");
    let mut head_ids = tok.encode_recurring(&format!("{} question: {instructions}", q.qtype.name()))?;

    let mut option_ids: Vec<Vec<u32>> = Vec::with_capacity(options.len());
    let order: Vec<usize> = q.option_order.clone().unwrap_or_else(|| (0..options.len()).collect());
    for option in order.iter().filter_map(|&i| options.get(i)) {
        let mut ids = vec![tok.mask.id];
        let mut text_ids = tok.encode_recurring(&format!(" {}", option.replace(mask, " ")))?;
        text_ids.truncate(OPTION_TOKEN_CAP);
        ids.extend(text_ids);
        option_ids.push(ids);
    }
    let option_tokens = |o: &[Vec<u32>]| o.iter().map(Vec::len).sum::<usize>() as i64;
    // Saturating: a request's budget is any 64-bit integer (Python's are unbounded); the
    // results are clamped below, so saturating gives laya's rows for every value.
    let mut budget = limits.head_max_len.saturating_sub(option_tokens(&option_ids));
    let mut tokens_per_option = None;
    if budget < 16 {
        let n = option_ids.len().max(1) as i64;
        let per = limits.head_max_len.saturating_sub(16).div_euclid(n).max(4) as usize;
        for o in &mut option_ids {
            o.truncate(per);
        }
        tokens_per_option = Some(per);
        budget = limits.head_max_len.saturating_sub(option_tokens(&option_ids));
    }
    let options_distinct = {
        let mut spans: Vec<&Vec<u32>> = option_ids.iter().collect();
        spans.sort();
        spans.dedup();
        spans.len()
    };
    head_ids.truncate(budget.max(8) as usize);

    let mut ids = Vec::with_capacity(limits.max_len.clamp(0, 1 << 16) as usize);
    ids.push(tok.cls.id);
    ids.extend_from_slice(&head_ids);
    ids.push(tok.sep.id);
    let mut markers = Vec::with_capacity(option_ids.len());
    for o in &option_ids {
        markers.push(ids.len());
        ids.extend_from_slice(o);
    }
    ids.push(tok.sep.id);
    let head_len = ids.len();
    let room = limits.max_len.saturating_sub(ids.len() as i64 + 1).max(0) as usize;
    let st = &state.ids;
    let kept = if state.truncate_left { &st[st.len().saturating_sub(room)..] } else { &st[..room.min(st.len())] };
    ids.extend_from_slice(kept);
    ids.push(tok.sep.id);
    ids.truncate(py_slice_end(ids.len(), limits.max_len));
    let marker_pos: Vec<u32> = markers.into_iter().filter(|&m| (m as i64) < limits.max_len).map(|m| m as u32).collect();
    if marker_pos.len() != options.len() {
        let message = if laya.is_0_4() {
            format!(
                "question {}: only {} of its {} option markers fit in max_len={} with head_max_len={} spent on the question; lower head_max_len, raise max_len, or use fewer options",
                repr_str(qid),
                marker_pos.len(),
                option_ids.len(),
                limits.max_len,
                limits.head_max_len
            )
        } else {
            format!("question {} options exceed head_max_len={}", repr_str(qid), limits.head_max_len)
        };
        return Err(LayoutError::Question(QuestionError { kind: QuestionErrorKind::DoesNotFit, message }));
    }
    let stats = LayoutStats {
        state_tokens: st.len(),
        state_tokens_dropped: st.len() - kept.len(),
        options: option_ids.len(),
        options_distinct,
        tokens_per_option,
    };
    let layout = match layout {
        OptionLayout::Sequential => None,
        // Every row here kept all its markers, so laying out after the `max_len` cut is laya's
        // "lay out, then cut both" (`parallel::row_layout`).
        OptionLayout::Parallel => Some(super::parallel::row_layout(&marker_pos, head_len, ids.len())),
    };
    let row = Row { input_ids: ids, marker_pos, qtype: q.qtype, layout };
    Ok((row, stats))
}

/// Why a row could not be built.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error(transparent)]
    Question(#[from] QuestionError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer() -> Tokenizer {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/laya-0.3.20/models/bpe-t5/tokenizer");
        Tokenizer::load(&dir).expect("fixture tokenizer")
    }

    #[test]
    fn any_64_bit_budget_lays_out_without_overflow() {
        let tok = tokenizer();
        let def = json::parse_str(
            r#"{"type": "choice", "instructions": "Which team?", "criteria": ["billing", "technical"]}"#,
            json::ParseOptions::default(),
        )
        .unwrap();
        let q = super::super::question::parse_question("q", &def).unwrap();
        let state = encode_state(&tok, &Value::Str("The app crashes.".into())).unwrap();
        for max_len in [i64::MIN, -1, 0, 512, i64::MAX] {
            for head_max_len in [i64::MIN, -1, 0, 192, i64::MAX] {
                let limits = Limits { max_len, head_max_len };
                match build_row(&tok, "q", &q, &state, limits, LayaVersion::V0_3_20, OptionLayout::Sequential) {
                    Ok((row, _)) => assert!(max_len > 0 && row.input_ids.len() as i64 <= max_len, "{limits:?}"),
                    Err(LayoutError::Question(e)) => assert_eq!(e.kind, QuestionErrorKind::DoesNotFit, "{limits:?}"),
                    Err(e) => panic!("{limits:?}: {e}"),
                }
            }
        }
    }

    #[test]
    fn python_slices_count_negative_ends_from_the_back() {
        assert_eq!(py_slice_end(10, 4), 4);
        assert_eq!(py_slice_end(10, 40), 10);
        assert_eq!(py_slice_end(10, -3), 7);
        assert_eq!(py_slice_end(2, -3), 0);
        assert_eq!(py_slice_end(10, 0), 0);
    }
}
