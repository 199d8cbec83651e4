//! `tessera generate`: streaming generation from our checkpoints or Hugging Face directories.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;

use super::invalid;
use super::tokenizer::TokenizerSpec;
use crate::checkpoint;
use crate::data::{
    from_record, parse_problem, AdditionTask, AdditionTokenizer, Gpt2Tokenizer, HfTokenizer,
    TextStream, Tokenizer,
};
use crate::generate::{generate, GenerateOptions, Sampling};
use crate::models::{hf_stop_tokens, Transformer};
use crate::rng::RngState;
use crate::{DType, Error, Result};

#[derive(Args, Clone, Debug)]
pub struct GenerateArgs {
    /// A checkpoint written by `tessera train`, or a Hugging Face model directory
    /// (config.json and model.safetensors; tokenizer.json and generation_config.json are used
    /// when present).
    #[arg(long)]
    pub model: PathBuf,
    /// Text to continue.
    #[arg(long, default_value = "")]
    pub prompt: String,
    /// Token ids to continue instead of --prompt, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub ids: Vec<u32>,
    /// auto (the checkpoint's recorded tokenizer, the model directory's tokenizer.json, else
    /// GPT-2's for a 50,257-token vocabulary), byte, gpt2, addition, or a tokenizer.json.
    #[arg(long, default_value = "auto")]
    pub tokenizer: TokenizerSpec,
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
    /// Stop after any of these token ids (the model's and the tokenizer's end-of-text tokens,
    /// and a model directory's generation_config.json ones, always are).
    #[arg(long, value_delimiter = ',')]
    pub stop: Vec<u32>,
    /// Device (e.g. cpu, wgpu:0); default: TESSERA_DEVICE, else the best present.
    #[arg(long)]
    pub device: Option<String>,
}

pub fn run(args: &GenerateArgs) -> Result<()> {
    let device = super::open_device(args.device.as_deref())?;
    let origin = args.model.display().to_string();
    let mut stop = args.stop.clone();
    let (model, recorded, digits) = if args.model.is_dir() {
        stop.extend(hf_stop_tokens(&args.model)?);
        let model = Transformer::from_hf_dir(&args.model, &device, DType::F32)?;
        (model, None, None)
    } else {
        let loaded = checkpoint::load(&args.model)?;
        let recorded = loaded.state.run.get("tokenizer").cloned();
        let digits = loaded.state.run["args"]["digits"]
            .as_u64()
            .and_then(|d| usize::try_from(d).ok());
        let model = Transformer::from_host_tensors(
            &loaded.config,
            &loaded.model,
            &origin,
            &device,
            DType::F32,
        )?;
        (model, recorded, digits)
    };
    let vocab = model.config.vocab_size;
    let tokenizer = match args.tokenizer.open()? {
        Some(t) => Some(t),
        None => model_tokenizer(args, recorded.as_ref(), vocab, &origin)?,
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
    let addition = tokenizer.as_ref().is_some_and(|t| t.name() == "addition");
    if addition && args.ids.is_empty() {
        AdditionTokenizer.encode(&args.prompt)?;
        if let Some((a, b)) = parse_problem(&args.prompt) {
            return solve_addition(&model, digits, a, b, args);
        }
    }
    let (prompt, shown): (Vec<u32>, String) = if !args.ids.is_empty() {
        let shown = tokenizer
            .as_ref()
            .map_or_else(String::new, |t| t.decode(&args.ids));
        (args.ids.clone(), shown)
    } else {
        let t = tokenizer
            .as_ref()
            .ok_or_else(|| invalid("generate", "give --ids or a tokenizer for --prompt"))?;
        let mut ids = t.encode(&args.prompt)?;
        if ids.is_empty() {
            ids = model.config.bos_token_id.or(t.eos()).into_iter().collect();
        }
        (ids, args.prompt.clone())
    };
    if prompt.is_empty() {
        return Err(invalid(
            "generate",
            "the prompt is empty and the model has no beginning-of-text token",
        ));
    }
    stop.extend(model.config.eos_token_id);
    stop.extend(tokenizer.as_ref().and_then(|t| t.eos()));
    let options = GenerateOptions {
        max_new_tokens: args.max_new_tokens,
        sampling: Sampling {
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
        },
        stop_tokens: stop.clone(),
    };
    let mut stdout = std::io::stdout();
    let mut write_err: Option<std::io::Error> = None;
    let mut write = |text: &str| {
        if let Err(e) = stdout
            .write_all(text.as_bytes())
            .and_then(|_| stdout.flush())
        {
            write_err.get_or_insert(e);
        }
    };
    write(&shown);
    let mut stream = tokenizer.as_deref().map(|t| TextStream::new(t, &prompt));
    let mut emit = |token: u32| {
        if stop.contains(&token) {
            return;
        }
        match &mut stream {
            Some(s) => write(&s.push(token)),
            None => write(&format!(" {token}")),
        }
    };
    generate(
        &model,
        &prompt,
        &options,
        &mut RngState::new(args.seed),
        &mut emit,
    )?;
    if let Some(s) = &mut stream {
        write(&s.finish());
    }
    write("\n");
    match write_err {
        Some(e) => Err(Error::io("stdout", e)),
        None => Ok(()),
    }
}

/// The tokenizer a model brings when `--tokenizer auto`: the one its checkpoint recorded, its
/// directory's `tokenizer.json`, GPT-2's for a 50,257-token vocabulary; with none of these,
/// `None` when the prompt is given as ids, else an error.
fn model_tokenizer(
    args: &GenerateArgs,
    recorded: Option<&serde_json::Value>,
    vocab: usize,
    origin: &str,
) -> Result<Option<Box<dyn Tokenizer>>> {
    if let Some(record) = recorded {
        return from_record(record, origin).map(Some);
    }
    let file = args.model.join("tokenizer.json");
    if args.model.is_dir() && file.is_file() {
        return Ok(Some(Box::new(HfTokenizer::from_file(&file)?)));
    }
    if vocab == 50257 {
        return Ok(Some(Box::new(Gpt2Tokenizer::new()?)));
    }
    if args.ids.is_empty() {
        return Err(invalid(
            "generate",
            format!(
                "cannot tell the tokenizer of a {vocab}-token model (no tokenizer.json): pass \
                 --tokenizer or --ids"
            ),
        ));
    }
    Ok(None)
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
