//! `xtc tokenizer export DIR`: the GGUF model's tokenizer as a Hugging Face
//! tokenizer directory (see [`xtc_serve::hf_tokenizer`]).
//!
//! Exit status: 0 written; 1 the model could not be found or read, its
//! tokenizer cannot be exported, or a file could not be written; 2 a usage
//! error.

use std::io::Write;
use std::path::PathBuf;

use xtc_model::find_model;
use xtc_model::format::gguf::Gguf;
use xtc_serve::hf_tokenizer;

/// Arguments of `xtc tokenizer`.
#[derive(Debug, Clone, clap::Args)]
pub struct TokenizerArgs {
    /// What to do.
    #[command(subcommand)]
    pub action: TokenizerAction,
}

/// `xtc tokenizer` actions.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum TokenizerAction {
    /// Write tokenizer.json and tokenizer_config.json (Hugging Face format)
    /// into DIR, for load clients that need a tokenizer directory (aiperf
    /// --tokenizer DIR) or the `tokenizers` package, offline.
    #[command(after_help = "\
Example:
  xtc tokenizer export /tmp/smollm2-tokenizer
  python3 -c 'import tokenizers; t = tokenizers.Tokenizer.from_file(\"/tmp/smollm2-tokenizer/tokenizer.json\"); print(t.encode(\"Hello world\").ids)'")]
    Export {
        /// The directory (created if missing; existing files are replaced).
        dir: PathBuf,
        /// GGUF model file (default: the fetched SmolLM2-135M-Instruct in the cache directory).
        #[arg(long, value_name = "PATH")]
        model: Option<PathBuf>,
    },
}

/// Runs `xtc tokenizer`; returns the exit status.
pub fn run(args: &TokenizerArgs, out: &mut dyn Write) -> i32 {
    let TokenizerAction::Export { dir, model } = &args.action;
    let path = match find_model(model.as_deref()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("xtc tokenizer: {e}");
            return 1;
        }
    };
    let g = match Gguf::open(&path) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("xtc tokenizer: {}: {e}", path.display());
            return 1;
        }
    };
    match hf_tokenizer::export(&g, dir) {
        Ok(()) => {
            let _ = writeln!(
                out,
                "xtc tokenizer: wrote {0}/tokenizer.json and {0}/tokenizer_config.json",
                dir.display()
            );
            0
        }
        Err(e) => {
            eprintln!("xtc tokenizer: {e}");
            1
        }
    }
}
