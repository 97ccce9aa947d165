//! `laya-edge layout`: each question's token layout (`input_ids`, `marker_pos`, `qtype`) for
//! JSON-lines requests on stdin, what laya's `build_sequence` produces; for checking the prompt
//! builder against laya without a model run.

use std::path::PathBuf;

use crate::bundle::HostBundle;
use crate::cli::jsonl;

#[derive(clap::Args)]
pub struct Args {
    /// A laya checkpoint directory (rl_agent_config.json, tokenizer/, ...).
    #[arg(long)]
    model: PathBuf,
    /// The laya whose token layout and validation to follow: 0.3.20 (the default) or 0.4.15.
    #[arg(long, value_parser = super::laya_version, default_value = "0.3.20")]
    laya: laya_topics::wire::LayaVersion,
}

pub fn run(args: Args) -> Result<(), String> {
    let bundle = HostBundle::load_as(&args.model, args.laya).map_err(|e| e.to_string())?;
    let out = std::io::BufWriter::new(std::io::stdout().lock());
    jsonl::for_each_line(std::io::stdin().lock(), out, |line| jsonl::layout_line(&bundle, line))
        .map_err(|e| e.to_string())
}
