//! Inputs that every engine must answer the same way: values at and past
//! what the storage dtype and the score bound allow, tables that name a
//! page twice or are too short, wrong lengths, and random batches of
//! extreme but legal magnitudes. Each backend's tests run
//! [`edge_cases`] through its engines and compare each [`Outcome`] with
//! the reference engine's: the same error, or outputs within tolerance.

use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

use super::Rng;
use crate::engine::{AttentionBatch, AttentionEngine, SeqAttention};
use crate::error::Error;
use crate::layout::{KvDtype, KvLayout, LayoutSpec};
use crate::page::{KEY_LIMIT, KvWrite, PageId, VALUE_LIMIT};

/// One write of an [`EdgeCase`].
#[derive(Debug, Clone)]
pub struct CaseWrite {
    /// Layer written.
    pub layer: u32,
    /// Pages of the sequence.
    pub table: Vec<PageId>,
    /// First position written.
    pub start: usize,
    /// Keys, `tokens × kv heads × head_dim`.
    pub k: Vec<f32>,
    /// Values, the same shape.
    pub v: Vec<f32>,
}

/// A named input: writes, then one attention batch over one sequence.
#[derive(Debug, Clone)]
pub struct EdgeCase {
    /// What it checks.
    pub name: String,
    /// Page layout (one head shard).
    pub layout: KvLayout,
    /// Pages of memory the case needs.
    pub pages: u32,
    /// Writes, in order; the first error ends the case.
    pub writes: Vec<CaseWrite>,
    /// The sequence's block table for attention.
    pub table: Vec<PageId>,
    /// Context length.
    pub kv_len: usize,
    /// Query tokens.
    pub q_len: usize,
    /// Queries, `q_len × q heads × head_dim`.
    pub q: Vec<f32>,
    /// Softmax scale.
    pub scale: f32,
}

/// What an engine did with an [`EdgeCase`].
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Write `index` failed with this error.
    WriteFailed(usize, Error),
    /// Attention failed with this error.
    AttendFailed(Error),
    /// Attention's output.
    Output(Vec<f32>),
}

impl EdgeCase {
    /// Runs the case on `engine` over `pages` (at least
    /// [`pages`](Self::pages) zeroed pages of [`layout`](Self::layout)).
    pub fn run<P: ?Sized, E: AttentionEngine<P> + ?Sized>(
        &self,
        engine: &E,
        pages: &mut P,
    ) -> Outcome {
        for (i, w) in self.writes.iter().enumerate() {
            let write = KvWrite {
                layer: w.layer,
                shard: 0,
                block_table: &w.table,
                start: w.start,
                k: &w.k,
                v: &w.v,
            };
            if let Err(e) = engine.write_kv(pages, &write) {
                return Outcome::WriteFailed(i, e);
            }
        }
        let seqs = [SeqAttention {
            block_table: &self.table,
            kv_len: self.kv_len,
            q_len: self.q_len,
        }];
        let mut out = vec![0f32; self.q.len()];
        match engine.attend(
            pages,
            &AttentionBatch::for_layer(0, &seqs, &self.q, self.scale),
            &mut out,
        ) {
            Ok(()) => Outcome::Output(out),
            Err(e) => Outcome::AttendFailed(e),
        }
    }

    /// Whether `got` is `want` (the reference engine's outcome): the same
    /// error, or outputs within `rtol` of the largest output magnitude.
    pub fn agrees(&self, got: &Outcome, want: &Outcome, rtol: f32) -> bool {
        match (got, want) {
            (Outcome::Output(a), Outcome::Output(b)) => {
                let scale = b.iter().fold(1e-6f32, |m, x| m.max(x.abs()));
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= rtol * scale)
            }
            _ => got == want,
        }
    }
}

fn layout(q: u32, kv: u32, hd: u32, bt: u32, dtype: KvDtype) -> KvLayout {
    KvLayout::new(LayoutSpec::new(1, q, kv, hd, bt, dtype)).expect("valid by construction")
}

/// One write of `tokens` tokens at 0 with keys and values from `f(token,
/// element)`, then decode attention of the last token.
fn simple(
    name: &str,
    layout: KvLayout,
    tokens: usize,
    key: impl Fn(usize, usize) -> f32,
    value: impl Fn(usize, usize) -> f32,
    q: f32,
    scale: f32,
) -> EdgeCase {
    let row = (layout.num_kv_heads() * layout.head_dim()) as usize;
    let bt = layout.block_tokens() as usize;
    let pages = tokens.div_ceil(bt) as u32;
    let table: Vec<PageId> = (0..pages).rev().map(PageId).collect();
    let k = (0..tokens * row).map(|i| key(i / row, i % row)).collect();
    let v = (0..tokens * row).map(|i| value(i / row, i % row)).collect();
    EdgeCase {
        name: name.into(),
        layout,
        pages,
        writes: vec![CaseWrite {
            layer: 0,
            table: table.clone(),
            start: 0,
            k,
            v,
        }],
        table,
        kv_len: tokens,
        q_len: 1,
        q: vec![q; (layout.num_q_heads() * layout.head_dim()) as usize],
        scale,
    }
}

/// The cases: the bugs of the engines-agree issue by name, then `random`
/// batches of extreme magnitudes drawn from `seed`.
pub fn edge_cases(seed: u64, random: usize) -> Vec<EdgeCase> {
    let issue = layout(2, 1, 32, 16, KvDtype::F16);
    let big_key = |t: usize, _| if t == 1 { 70_000.0 } else { 0.5 };
    let big_value = |t: usize, _| if t == 1 { 7.0 } else { 0.5 };
    let mut cases = vec![
        // The issue's example: K = 70000 cannot be stored as f16.
        simple("k 70000 in f16", issue, 3, big_key, big_value, 0.5, 0.18),
        // The same key in f32 pages is legal: the maths' limit is V = 7.
        simple(
            "k 70000 in f32",
            layout(2, 1, 32, 16, KvDtype::F32),
            3,
            big_key,
            big_value,
            0.5,
            0.18,
        ),
        simple(
            "k f32::MAX in bf16",
            layout(2, 1, 32, 16, KvDtype::Bf16),
            3,
            |t, _| if t == 2 { f32::MAX } else { 1.0 },
            |_, _| 1.0,
            0.5,
            0.18,
        ),
        // Finite in f32 storage, but past the key limit: its scores could
        // overflow.
        simple(
            "k 3e38 in f32",
            layout(2, 1, 32, 16, KvDtype::F32),
            3,
            |t, e| if t == 0 && e == 5 { 3e38 } else { 1.0 },
            |_, _| 1.0,
            0.5,
            0.18,
        ),
        // Finite in f32 storage, but past the value limit: values of
        // 3e38 and -3e38 would sum to +inf or NaN before the division.
        simple(
            "v 3e38 in f32",
            layout(2, 1, 32, 16, KvDtype::F32),
            4,
            |_, _| 0.0,
            |t, _| if t < 2 { 3e38 } else { -3e38 },
            0.5,
            0.18,
        ),
        // A value f16 cannot hold.
        simple(
            "v 1e5 in f16",
            layout(4, 2, 16, 7, KvDtype::F16),
            9,
            |_, _| 0.1,
            |t, e| if t == 8 && e == 17 { -1e5 } else { 0.1 },
            0.3,
            0.25,
        ),
        // Keys at the limit and queries at theirs: scores near f32::MAX / 4
        // are finite everywhere and the softmax one-hot.
        simple(
            "k at the limit, q at its limit",
            layout(2, 1, 32, 16, KvDtype::F32),
            20,
            |t, _| if t == 13 { KEY_LIMIT } else { -KEY_LIMIT },
            |t, e| (t * 3 + e) as f32,
            AttentionBatch::query_limit(32, 0.18),
            0.18,
        ),
        // A query just past its limit.
        simple(
            "q past its limit",
            layout(2, 1, 32, 16, KvDtype::F32),
            4,
            |_, _| 1.0,
            |_, _| 1.0,
            AttentionBatch::query_limit(32, 0.18) * 1.01,
            0.18,
        ),
    ];
    // A write that touches a page the table also names elsewhere.
    let mut dup = simple(
        "a written page twice in the table",
        layout(2, 1, 8, 4, KvDtype::F16),
        8,
        |t, e| (t + e) as f32 / 16.0,
        |t, _| t as f32,
        0.5,
        0.35,
    );
    dup.writes[0].table = vec![PageId(0), PageId(0)];
    cases.push(dup);
    // Attention may read one page at two positions: legal, defined.
    let mut read_twice = simple(
        "a page read twice",
        layout(2, 1, 8, 4, KvDtype::F16),
        4,
        |t, e| (t * 2 + e) as f32 / 32.0,
        |t, _| t as f32,
        0.5,
        0.35,
    );
    read_twice.table = vec![PageId(0), PageId(0)];
    read_twice.kv_len = 8;
    cases.push(read_twice);
    // A context past its table.
    let mut past = simple(
        "context past the table",
        issue,
        3,
        |_, _| 0.5,
        |_, _| 0.5,
        0.5,
        0.18,
    );
    past.kv_len = 17;
    cases.push(past);
    // A key one element short of a whole token.
    let mut short = simple(
        "k one element short",
        issue,
        2,
        |_, _| 0.5,
        |_, _| 0.5,
        0.5,
        0.18,
    );
    short.writes[0].k.pop();
    cases.push(short);

    let mut rng = Rng::new(seed);
    for i in 0..random {
        let dtype = [KvDtype::F32, KvDtype::F16, KvDtype::Bf16][rng.below(3) as usize];
        let kv = 1 + rng.below(2) as u32;
        let ratio = 1 + rng.below(4) as u32;
        let hd = [8, 16, 32, 64][rng.below(4) as usize];
        let bt = [1, 7, 16][rng.below(3) as usize];
        let l = layout(kv * ratio, kv, hd, bt, dtype);
        // Magnitudes from tiny to past what the dtype or limit allows.
        let exp = |rng: &mut Rng| libm::exp2f(rng.below(140) as f32 - 40.0);
        let (km, vm) = (exp(&mut rng), exp(&mut rng));
        let tokens = 1 + rng.below(40) as usize;
        let seed = rng.next_u64();
        let mut c = simple(
            "random extreme",
            l,
            tokens,
            |t, e| km * Rng::new(seed ^ (t * 131 + e) as u64).unit(),
            |t, e| vm * Rng::new(!seed ^ (t * 131 + e) as u64).unit(),
            0.0,
            0.125,
        );
        let q_limit = AttentionBatch::query_limit(hd, 0.125);
        let mut qm = exp(&mut rng).min(q_limit * 2.0);
        // A legal case keeps its scores within ±30: beyond that the
        // softmax of near-equal large scores is ill-conditioned, and two
        // correct engines that sum in another order may pick another key.
        // Illegal cases keep their magnitudes, to be refused.
        let legal = km <= KEY_LIMIT
            && vm <= VALUE_LIMIT
            && dtype.fits(km)
            && dtype.fits(vm)
            && qm <= q_limit;
        if legal {
            qm = qm.min(30.0 / (km * hd as f32 * 0.125));
        }
        c.q.iter_mut().for_each(|x| *x = qm * rng.unit());
        c.name = alloc::format!("random extreme {i} (k ~{km:e}, v ~{vm:e}, q ~{qm:e}, {dtype:?})");
        cases.push(c);
    }
    cases
}
