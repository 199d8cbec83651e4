//! Rotary and attention samples: sequences beyond 512, head dims 64/80/128/256, grouped-query
//! heads, KV-cache offsets (Tq < Tk) and keys and values read from a cache's buffer, rows with
//! no visible key, rows and keys in whole blocks of a tensor-core kernel; attention over a
//! cache at device positions.

use tessera::{DType, Op};

use super::{fixed, input, stats, uniform, Gen, Input, Sample, View};

pub(super) fn rotary() -> Vec<Sample> {
    let case = |x: &[usize]| {
        let r = x.len();
        let half = [x[r - 2], x[r - 1] / 2];
        let table = || input(&half, uniform(-1.0, 1.0)).no_grad();
        Sample::new(
            Op::Rotary,
            format!("{x:?}"),
            vec![input(x, uniform(-2.0, 2.0)), table(), table()],
        )
        .reduce(2)
    };
    vec![
        case(&[1, 2, 9, 8]),
        case(&[2, 33, 128]),
        case(&[1, 4, 600, 64]),
        case(&[3, 1, 2]),
        case(&[0, 5, 4]),
        case(&[1, 3, 4]).gradcheck(),
    ]
}

/// One attention problem: batch, query heads, key/value heads, Tq, Tk, D, Dv.
#[derive(Clone, Copy)]
struct Problem {
    causal: bool,
    b: usize,
    hq: usize,
    hkv: usize,
    tq: usize,
    tk: usize,
    d: usize,
    dv: usize,
}

/// `dims` is `[B, Hq, Hkv, Tq, Tk, D, Dv]`.
const fn p(causal: bool, dims: [usize; 7]) -> Problem {
    let [b, hq, hkv, tq, tk, d, dv] = dims;
    Problem {
        causal,
        b,
        hq,
        hkv,
        tq,
        tk,
        d,
        dv,
    }
}

impl Problem {
    fn qkv(&self) -> Vec<Input> {
        vec![
            input(&[self.b, self.hq, self.tq, self.d], uniform(-1.0, 1.0)),
            input(&[self.b, self.hkv, self.tk, self.d], uniform(-1.0, 1.0)),
            input(&[self.b, self.hkv, self.tk, self.dv], uniform(-1.0, 1.0)),
        ]
    }

    fn scale(&self) -> f64 {
        1.0 / (self.d.max(1) as f64).sqrt()
    }

    fn describe(&self) -> String {
        let Problem {
            causal,
            b,
            hq,
            hkv,
            tq,
            tk,
            d,
            dv,
        } = *self;
        format!("causal {causal} B {b} Hq {hq} Hkv {hkv} Tq {tq} Tk {tk} D {d} Dv {dv}")
    }

    /// The longest sum behind any output or gradient.
    fn reduction(&self) -> usize {
        let group = self.hq / self.hkv.max(1);
        [self.tk, self.tq * group, self.d, self.dv]
            .into_iter()
            .max()
            .unwrap_or(1)
    }
}

const PROBLEMS: [Problem; 21] = [
    // Rows and keys in whole blocks of a tensor-core kernel (64 query rows, head-size keys):
    // compiled for their sizes, unclamped.
    p(true, [1, 2, 1, 128, 128, 64, 64]),
    // Causal over more keys than queries, a query head per key head, rows and keys over
    // several tiles: the backward's products leave out what the mask hides, whole tiles and
    // parts of k, on both sides of the band.
    p(true, [1, 2, 2, 512, 576, 64, 64]),
    p(true, [1, 2, 2, 64, 192, 64, 64]),
    p(false, [1, 2, 2, 64, 256, 128, 128]),
    p(true, [2, 4, 2, 17, 17, 64, 64]),
    p(false, [2, 4, 2, 17, 17, 64, 64]),
    p(true, [1, 2, 1, 600, 600, 64, 64]),
    p(false, [1, 1, 1, 600, 600, 64, 64]),
    p(true, [1, 2, 2, 33, 33, 80, 80]),
    p(true, [1, 2, 2, 33, 33, 128, 128]),
    p(true, [1, 2, 2, 19, 19, 256, 256]),
    p(false, [1, 2, 1, 21, 25, 256, 256]),
    p(true, [1, 4, 2, 5, 37, 64, 64]),
    p(true, [1, 2, 1, 1, 600, 64, 64]),
    p(true, [1, 4, 2, 6, 300, 128, 96]),
    p(false, [2, 2, 2, 7, 13, 32, 48]),
    p(false, [1, 2, 1, 13, 7, 16, 16]),
    p(true, [2, 4, 1, 9, 9, 32, 32]),
    p(true, [1, 2, 2, 0, 5, 8, 8]),
    p(false, [1, 1, 1, 3, 0, 8, 8]),
    p(false, [1, 3, 3, 70, 70, 8, 8]),
];

const SMALL: [Problem; 2] = [
    p(true, [1, 2, 1, 4, 5, 4, 3]),
    p(false, [1, 2, 2, 3, 4, 4, 4]),
];

pub(super) fn forward() -> Vec<Sample> {
    let case = |pr: &Problem| {
        Sample::new(Op::Attention { causal: pr.causal }, pr.describe(), pr.qkv())
            .scalars(&[pr.scale()])
            .reduce(pr.reduction())
    };
    let mut out: Vec<Sample> = PROBLEMS.iter().map(case).collect();
    out.extend(SMALL.iter().map(|pr| case(pr).gradcheck()));
    // Keys and values read in place from a KV cache with room for more positions: a decoding
    // step, a short continuation and a long one.
    for (pr, room) in [
        p(true, [1, 4, 2, 1, 200, 64, 64]),
        p(true, [2, 4, 2, 9, 30, 32, 48]),
        p(true, [1, 2, 2, 70, 100, 64, 64]),
        p(true, [1, 2, 2, 64, 128, 64, 64]),
    ]
    .iter()
    .zip([24, 5, 28, 32])
    {
        let mut inputs = pr.qkv();
        for kv in &mut inputs[1..] {
            *kv = kv.clone().view(View::Capacity(room));
        }
        out.push(
            Sample::new(Op::Attention { causal: pr.causal }, pr.describe(), inputs)
                .scalars(&[pr.scale()])
                .reduce(pr.reduction()),
        );
    }
    out
}

pub(super) fn backward() -> Vec<Sample> {
    PROBLEMS
        .iter()
        .chain(&SMALL)
        .map(|pr| {
            let fwd = |output| Gen::Forward {
                op: Op::Attention { causal: pr.causal },
                args: vec![0, 1, 2],
                scalars: vec![pr.scale()],
                output,
            };
            let mut inputs = pr.qkv();
            let out_shape = [pr.b, pr.hq, pr.tq, pr.dv];
            inputs.push(input(&out_shape, fwd(0)));
            inputs.push(stats(&out_shape[..3], fwd(1)));
            inputs.push(input(&out_shape, uniform(-1.0, 1.0)));
            Sample::new(
                Op::AttentionBackward { causal: pr.causal },
                pr.describe(),
                inputs,
            )
            .scalars(&[pr.scale()])
            .reduce(pr.reduction())
        })
        .collect()
}

/// Attention over a KV cache at positions given on the device: a decoding step (at the first
/// and last slot), a prompt, positions past the cache and before it (no visible key), grouped
/// heads, wide heads, and keys and values read from a cache's buffer with room for more.
pub(super) fn cached() -> Vec<Sample> {
    let case = |pr: Problem, positions: &[i64], room: usize| {
        let mut inputs = pr.qkv();
        if room > 0 {
            for kv in &mut inputs[1..] {
                *kv = kv.clone().view(View::Capacity(room));
            }
        }
        let values = positions.iter().map(|&i| i as f64).collect();
        inputs.push(fixed(&[pr.tq], DType::I32, Gen::Values(values)));
        Sample::new(
            Op::CachedAttention,
            format!("{} positions {positions:?}", pr.describe()),
            inputs,
        )
        .scalars(&[pr.scale()])
        .reduce(pr.reduction())
    };
    let prompt: Vec<i64> = (0..5).collect();
    vec![
        case(p(true, [1, 4, 2, 1, 64, 64, 64]), &[37], 0),
        case(p(true, [1, 4, 2, 1, 64, 64, 64]), &[63], 0),
        case(p(true, [1, 12, 12, 1, 64, 64, 64]), &[0], 0),
        case(p(true, [2, 2, 2, 5, 16, 32, 48]), &prompt, 0),
        case(p(true, [1, 2, 1, 3, 8, 16, 16]), &[-1, 100, 5], 0),
        case(p(true, [1, 8, 1, 2, 320, 128, 128]), &[299, 300], 0),
        case(p(true, [1, 2, 2, 1, 40, 256, 256]), &[20], 0),
        case(p(true, [1, 2, 2, 1, 600, 80, 80]), &[599], 0),
        case(p(true, [2, 4, 2, 1, 30, 64, 64]), &[17], 6),
        case(p(true, [1, 2, 2, 0, 5, 8, 8]), &[], 0),
    ]
}

/// Attention that first writes new keys and values into its cache: one query per head at a
/// position inside the cache, at its last row, past it, negative (nothing written, as
/// `IndexCopy` skips them) and past a first pass of 256 keys, batches, grouped heads and
/// several queries (which backends may run as the write and then the cached attention), each
/// in place and not. Each head's cache fits the 64 KiB bindings of the small-binding test: an
/// index copy does not split a head's rows, so a head past one binding is `Unsupported` there.
pub(super) fn append() -> Vec<Sample> {
    let case = |pr: Problem, positions: &[i64], in_place: bool| {
        let values = positions.iter().map(|&i| i as f64).collect();
        let inputs = vec![
            input(&[pr.b, pr.hq, pr.tq, pr.d], uniform(-1.0, 1.0)),
            input(&[2, pr.b, pr.hkv, pr.tk, pr.d], uniform(-1.0, 1.0)),
            fixed(&[pr.tq], DType::I32, Gen::Values(values)),
            input(&[2, pr.b, pr.hkv, pr.tq, pr.d], uniform(-1.0, 1.0)),
        ];
        let sample = Sample::new(
            Op::AppendAttention,
            format!(
                "{} positions {positions:?} in place {in_place}",
                pr.describe()
            ),
            inputs,
        )
        .scalars(&[pr.scale()])
        .reduce_each(&[pr.reduction(), 1]);
        if in_place {
            sample.in_place()
        } else {
            sample
        }
    };
    let problems: [(Problem, &[i64]); 9] = [
        (p(true, [1, 4, 4, 1, 64, 64, 64]), &[37]),
        (p(true, [1, 12, 12, 1, 200, 64, 64]), &[199]),
        (p(true, [1, 2, 2, 1, 64, 16, 16]), &[100]),
        (p(true, [1, 2, 2, 1, 40, 32, 32]), &[-1]),
        (p(true, [2, 2, 2, 1, 48, 64, 64]), &[0]),
        (p(true, [1, 8, 2, 1, 50, 64, 64]), &[20]),
        (p(true, [2, 2, 2, 3, 24, 16, 16]), &[5, 6, 7]),
        (p(true, [1, 2, 2, 1, 30, 12, 12]), &[9]),
        (p(true, [1, 1, 1, 1, 300, 16, 16]), &[280]),
    ];
    problems
        .into_iter()
        .flat_map(|(pr, positions)| [false, true].map(|in_place| case(pr, positions, in_place)))
        .collect()
}
