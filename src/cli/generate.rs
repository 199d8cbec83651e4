//! `tessera generate`: streaming generation from our checkpoints or Hugging Face directories.

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, ValueEnum};

use super::invalid;
use crate::checkpoint;
use crate::data::{
    parse_problem, AdditionTask, AdditionTokenizer, ByteTokenizer, Gpt2Tokenizer, Tokenizer,
};
use crate::generate::{generate, GenerateOptions, Sampling};
use crate::models::Transformer;
use crate::rng::RngState;
use crate::{DType, Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TokenizerChoice {
    /// The tokenizer the checkpoint was trained with; GPT-2's for a 50,257-token vocabulary.
    Auto,
    Byte,
    Gpt2,
    /// The addition task's characters `0-9 + = .`.
    Addition,
}

#[derive(Args, Clone, Debug)]
pub struct GenerateArgs {
    /// A checkpoint written by `tessera train`, or a Hugging Face model directory
    /// (config.json and model.safetensors).
    #[arg(long)]
    pub model: PathBuf,
    /// Text to continue.
    #[arg(long, default_value = "")]
    pub prompt: String,
    /// Token ids to continue instead of --prompt, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub ids: Vec<u32>,
    #[arg(long, value_enum, default_value = "auto")]
    pub tokenizer: TokenizerChoice,
    /// New tokens at most.
    #[arg(long, default_value_t = 64)]
    pub max_new_tokens: usize,
    /// 0 is greedy; otherwise logits are divided by it before sampling.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// Sample among the k most likely tokens.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Sample among the most likely tokens whose probability reaches p.
    #[arg(long)]
    pub top_p: Option<f64>,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop after any of these token ids (the model's end-of-text token is always one).
    #[arg(long, value_delimiter = ',')]
    pub stop: Vec<u32>,
    /// Device (e.g. cpu, wgpu:0); default: TESSERA_DEVICE, else the best present.
    #[arg(long)]
    pub device: Option<String>,
}

pub fn run(args: &GenerateArgs) -> Result<()> {
    let device = super::open_device(args.device.as_deref())?;
    let (model, trained_with, digits) = if args.model.is_dir() {
        (
            Transformer::from_hf_dir(&args.model, &device, DType::F32)?,
            None,
            None,
        )
    } else {
        let loaded = checkpoint::load(&args.model)?;
        let tokenizer = loaded
            .state
            .run
            .get("tokenizer")
            .and_then(|t| t.as_str())
            .map(str::to_string);
        let digits = loaded.state.run["args"]["digits"]
            .as_u64()
            .and_then(|d| usize::try_from(d).ok());
        let origin = args.model.display().to_string();
        (
            Transformer::from_host_tensors(
                &loaded.config,
                &loaded.model,
                &origin,
                &device,
                DType::F32,
            )?,
            tokenizer,
            digits,
        )
    };
    let vocab = model.config.vocab_size;
    let choice = match (args.tokenizer, trained_with.as_deref()) {
        (TokenizerChoice::Auto, Some("byte")) => TokenizerChoice::Byte,
        (TokenizerChoice::Auto, Some("gpt2")) => TokenizerChoice::Gpt2,
        (TokenizerChoice::Auto, Some("addition")) => TokenizerChoice::Addition,
        (TokenizerChoice::Auto, _) if vocab == 50257 => TokenizerChoice::Gpt2,
        (TokenizerChoice::Auto, _) if args.ids.is_empty() => {
            return Err(invalid(
                "generate",
                format!(
                    "cannot tell the tokenizer of a {vocab}-token model: pass --tokenizer or --ids"
                ),
            ));
        }
        (other, _) => other,
    };
    let tokenizer: Option<Box<dyn Tokenizer>> = match choice {
        TokenizerChoice::Byte => Some(Box::new(ByteTokenizer)),
        TokenizerChoice::Gpt2 => Some(Box::new(Gpt2Tokenizer::new()?)),
        TokenizerChoice::Addition => Some(Box::new(AdditionTokenizer)),
        TokenizerChoice::Auto => None,
    };
    if let Some(t) = &tokenizer {
        if t.vocab_size() > vocab {
            return Err(invalid(
                "generate",
                format!(
                    "the {} tokenizer has {} tokens but the model only {vocab}",
                    t.name(),
                    t.vocab_size()
                ),
            ));
        }
    }
    if choice == TokenizerChoice::Addition && args.ids.is_empty() {
        let foreign: String = args
            .prompt
            .chars()
            .filter(|&c| !c.is_whitespace() && AdditionTokenizer.encode(&c.to_string()).is_empty())
            .collect();
        if !foreign.is_empty() {
            return Err(invalid(
                "generate",
                format!(
                    "the addition model reads the characters 0-9 + = . only; the prompt has `{foreign}`"
                ),
            ));
        }
        if let Some((a, b)) = parse_problem(&args.prompt) {
            return solve_addition(&model, digits, a, b, args);
        }
    }
    let prompt: Vec<u32> = if !args.ids.is_empty() {
        args.ids.clone()
    } else {
        let t = tokenizer
            .as_ref()
            .ok_or_else(|| invalid("generate", "give --ids or a tokenizer for --prompt"))?;
        let mut ids = t.encode(&args.prompt);
        if ids.is_empty() {
            ids = model.config.bos_token_id.or(t.eos()).into_iter().collect();
        }
        ids
    };
    if prompt.is_empty() {
        return Err(invalid(
            "generate",
            "the prompt is empty and the model has no beginning-of-text token",
        ));
    }
    let mut stop = args.stop.clone();
    stop.extend(model.config.eos_token_id);
    stop.extend(tokenizer.as_ref().and_then(|t| t.eos()));
    let options = GenerateOptions {
        max_new_tokens: args.max_new_tokens,
        sampling: Sampling {
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
        },
        stop_tokens: stop,
    };
    let mut stdout = std::io::stdout();
    if let Some(t) = &tokenizer {
        print!("{}", t.decode(&prompt));
    }
    let mut write_err: Option<std::io::Error> = None;
    let mut emit = |token: u32| {
        let piece = match &tokenizer {
            Some(t) => t.decode(&[token]),
            None => format!(" {token}"),
        };
        if let Err(e) = stdout
            .write_all(piece.as_bytes())
            .and_then(|_| stdout.flush())
        {
            write_err.get_or_insert(e);
        }
    };
    generate(
        &model,
        &prompt,
        &options,
        &mut RngState::new(args.seed),
        &mut emit,
    )?;
    println!();
    match write_err {
        Some(e) => Err(Error::io("stdout", e)),
        None => Ok(()),
    }
}

/// An addition problem asked as people write it (`123+456=`), posed as the task poses it
/// (operands zero-padded to the trained digit count, the answer emitted least-significant
/// digit first) and answered as people write it: `123+456=579`. Without a recorded digit
/// count (a model directory), the wider operand's is used.
fn solve_addition(
    model: &Transformer,
    digits: Option<usize>,
    a: u64,
    b: u64,
    args: &GenerateArgs,
) -> Result<()> {
    let widest = a.max(b).checked_ilog10().unwrap_or(0) as usize + 1;
    let task = AdditionTask::new(digits.unwrap_or(widest))?;
    let prompt = task.encode_problem(a, b)?;
    let options = GenerateOptions {
        max_new_tokens: task.answer_len(),
        sampling: Sampling {
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
        },
        stop_tokens: vec![task.eos()],
    };
    let mut answer = Vec::new();
    generate(
        model,
        &prompt,
        &options,
        &mut RngState::new(args.seed),
        &mut |t| answer.push(t),
    )?;
    match task.show(a, b, &answer) {
        Some(line) => println!("{line}"),
        None => println!(
            "{a}+{b}= (the model wrote `{}`, which is no number)",
            AdditionTokenizer.decode(&answer)
        ),
    }
    Ok(())
}
