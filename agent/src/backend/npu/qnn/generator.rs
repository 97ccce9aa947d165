//! Building a context binary from a DLC on the board, once, with Qualcomm's
//! `qnn-context-binary-generator`, and caching it in the state directory.
//!
//! Context binaries are specific to the QAIRT release and the SoC, so the cache is keyed by both:
//! `<state>/qnn-context/<qairt build id>/<soc>/<dlc stem>.bin`. Generation takes ~33 s for the
//! 421M encoder; loading the cached binary ~1 s. The generator is the SDK's own tool, run as a
//! child process; this module only builds its command line and manages the cache.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::QnnError;

/// Where the generator and the libraries it needs are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GeneratorConfig {
    /// `qnn-context-binary-generator`.
    pub program: PathBuf,
    /// The HTP backend library the binary is generated for (`libQnnHtp.so`).
    pub backend_lib: PathBuf,
    /// The DLC model loader library (`libQnnModelDlc.so`).
    pub model_lib: PathBuf,
}

/// Keeps a cache key to one path component.
fn component(s: &str) -> String {
    let s: String =
        s.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') { c } else { '_' }).collect();
    if s.is_empty() || s.starts_with('.') { format!("_{s}") } else { s }
}

/// The cached binary for `dlc` under `state_dir`.
pub fn cache_path(state_dir: &Path, qairt: &str, soc: &str, dlc: &Path) -> PathBuf {
    let stem = dlc.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into());
    state_dir.join("qnn-context").join(component(qairt)).join(component(soc)).join(format!("{}.bin", component(&stem)))
}

/// The generator's command line: the binary lands in `out_dir/<name>.bin`.
pub fn command(cfg: &GeneratorConfig, dlc: &Path, out_dir: &Path, name: &str) -> Command {
    let mut cmd = Command::new(&cfg.program);
    cmd.arg("--backend")
        .arg(&cfg.backend_lib)
        .arg("--model")
        .arg(&cfg.model_lib)
        .arg("--dlc_path")
        .arg(dlc)
        .arg("--binary_file")
        .arg(name)
        .arg("--output_dir")
        .arg(out_dir);
    cmd
}

/// The cached context binary for `dlc`, generating it first if there is none.
pub fn ensure_context_binary(
    cfg: &GeneratorConfig,
    state_dir: &Path,
    qairt: &str,
    soc: &str,
    dlc: &Path,
) -> Result<PathBuf, QnnError> {
    let target = cache_path(state_dir, qairt, soc, dlc);
    if target.is_file() {
        return Ok(target);
    }
    let dir = target.parent().expect("cache paths have a parent").to_owned();
    let io = |e: std::io::Error| QnnError::Generator(format!("{}: {e}", dir.display()));
    std::fs::create_dir_all(&dir).map_err(io)?;
    let work = dir.join(format!(".generating-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(io)?;
    let name = "context";
    let out = command(cfg, dlc, &work, name)
        .output()
        .map_err(|e| QnnError::Generator(format!("cannot run {}: {e}", cfg.program.display())))?;
    let produced = work.join(format!("{name}.bin"));
    let result = if !out.status.success() {
        Err(QnnError::Generator(format!(
            "{} failed ({}): {}",
            cfg.program.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).lines().rev().take(5).collect::<Vec<_>>().join(" | ")
        )))
    } else if !produced.is_file() {
        Err(QnnError::Generator(format!("{} did not write {}", cfg.program.display(), produced.display())))
    } else {
        // A rename within one directory tree: readers see the old state or the whole file.
        std::fs::rename(&produced, &target).map_err(io).map(|_| target.clone())
    };
    std::fs::remove_dir_all(&work).ok();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> GeneratorConfig {
        GeneratorConfig {
            program: "/opt/qairt/bin/qnn-context-binary-generator".into(),
            backend_lib: "/usr/lib/libQnnHtp.so".into(),
            model_lib: "/usr/lib/libQnnModelDlc.so".into(),
        }
    }

    #[test]
    fn the_generator_command_names_backend_model_dlc_and_output() {
        let cmd = command(&cfg(), Path::new("/b/laya_encoder_256_sqnr.dlc"), Path::new("/var/lib/laya/tmp"), "context");
        assert_eq!(cmd.get_program(), "/opt/qairt/bin/qnn-context-binary-generator");
        let args: Vec<_> = cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(
            args,
            [
                "--backend",
                "/usr/lib/libQnnHtp.so",
                "--model",
                "/usr/lib/libQnnModelDlc.so",
                "--dlc_path",
                "/b/laya_encoder_256_sqnr.dlc",
                "--binary_file",
                "context",
                "--output_dir",
                "/var/lib/laya/tmp",
            ]
        );
    }

    #[test]
    fn the_cache_is_keyed_by_qairt_release_and_soc() {
        let p =
            cache_path(Path::new("/var/lib/laya"), "v2.37.1.250807", "qcs6490", Path::new("/b/laya_encoder_mm.dlc"));
        assert_eq!(p, Path::new("/var/lib/laya/qnn-context/v2.37.1.250807/qcs6490/laya_encoder_mm.bin"));
        let q = cache_path(Path::new("/s"), "../x", "a/b", Path::new("m.dlc"));
        assert_eq!(q, Path::new("/s/qnn-context/_.._x/a_b/m.bin"));
    }

    #[test]
    fn a_cached_binary_is_used_without_running_the_generator() {
        let state = std::env::temp_dir().join(format!("laya-qnn-gen-{}", std::process::id()));
        let dlc = Path::new("/nonexistent/enc.dlc");
        let cached = cache_path(&state, "v2.51.0", "qcs6490", dlc);
        std::fs::create_dir_all(cached.parent().unwrap()).unwrap();
        std::fs::write(&cached, b"ctx").unwrap();
        let mut c = cfg();
        c.program = "/nonexistent/generator".into();
        assert_eq!(ensure_context_binary(&c, &state, "v2.51.0", "qcs6490", dlc).unwrap(), cached);
        std::fs::remove_file(&cached).unwrap();
        let err = ensure_context_binary(&c, &state, "v2.51.0", "qcs6490", dlc).unwrap_err();
        assert!(err.to_string().contains("cannot run /nonexistent/generator"), "{err}");
        std::fs::remove_dir_all(&state).ok();
    }
}
