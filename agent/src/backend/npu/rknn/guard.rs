//! The constant-output guard: a runtime that answers every question the same is broken.
//!
//! librknnrt 2.4.2 on NPU driver 0.9.8 loads the Laya graph, runs it without an error and returns
//! the same vector for every input. The version allowlist keeps that runtime out, but the symptom
//! can have other causes (a driver update, a wrong graph), and nothing else would notice: the
//! answers are well-formed, just meaningless. Two different rows whose raw 64-slot outputs are
//! bit-identical cannot come from a working encoder, so the guard compares each row's output with
//! the previous row's and reports the runtime as broken (the watchdog's fatal path).

use crate::prompt::Row;

/// The previous row and its raw output bits.
#[derive(Debug, Default)]
pub(crate) struct ConstantOutputGuard {
    last: Option<(Row, Vec<u32>)>,
}

impl ConstantOutputGuard {
    /// Records `row`'s raw output; an error message if a different previous row came back with
    /// exactly the same output.
    pub fn check(&mut self, row: &Row, raw: &[f32]) -> Result<(), String> {
        let bits: Vec<u32> = raw.iter().map(|v| v.to_bits()).collect();
        if let Some((prev_row, prev_bits)) = &self.last
            && *prev_bits == bits
            && prev_row != row
        {
            return Err(format!(
                "constant output: two different rows ({} and {} tokens) came back with bit-identical logits; the runtime is broken (librknnrt 2.4.2 on NPU driver 0.9.8 does this)",
                prev_row.input_ids.len(),
                row.input_ids.len()
            ));
        }
        self.last = Some((row.clone(), bits));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prompt::QType;

    fn row(ids: &[u32]) -> Row {
        Row { input_ids: ids.to_vec(), marker_pos: vec![0], qtype: QType::Choice, layout: None }
    }

    #[test]
    fn the_same_output_for_different_rows_is_refused() {
        let mut g = ConstantOutputGuard::default();
        g.check(&row(&[1, 2]), &[0.5, -1e4]).unwrap();
        let err = g.check(&row(&[1, 3]), &[0.5, -1e4]).unwrap_err();
        assert!(err.contains("constant output"), "{err}");
    }

    #[test]
    fn the_same_row_twice_and_different_outputs_pass() {
        let mut g = ConstantOutputGuard::default();
        g.check(&row(&[1, 2]), &[0.5, -1e4]).unwrap();
        g.check(&row(&[1, 2]), &[0.5, -1e4]).unwrap();
        g.check(&row(&[1, 3]), &[0.25, -1e4]).unwrap();
        // -0.0 and 0.0 differ in bits: the guard compares bits, not values.
        g.check(&row(&[4]), &[0.0]).unwrap();
        g.check(&row(&[5]), &[-0.0]).unwrap();
    }
}
