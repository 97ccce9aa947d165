//! `laya-edge check --model DIR`: validates a model directory or bundle without running it:
//! the manifest, the checkpoint and tokenizer, the weights' header against the file and the
//! architecture, every file against its sha256, an RKNN graph's length against its own header,
//! the probe's layout. Every error names the file it is about.

use std::path::PathBuf;

use laya_edge::bundle::assemble;

#[derive(clap::Args)]
pub struct Args {
    /// The bundle (or laya checkpoint) directory.
    #[arg(long)]
    model: PathBuf,
}

pub fn run(args: Args) -> Result<(), String> {
    let report = assemble::check(&args.model).map_err(|e| e.to_string())?;
    println!("{report}");
    Ok(())
}
