//! Sampling: argmax with its log-probability (ties to the first index) and top-p sampling against the
//! host sampler's kept set, frequencies and log-probabilities.

use ctxscope_kernels::device::Device;

use crate::report::{compare, nan_buf, read, Cmp, Report, Res, Row, F32_LIMIT, TAIL};
use crate::rng::Rng;

/// log-softmax of `row` at index `i`, temperature 1, in f64.
fn log_softmax_at(row: &[f32], i: usize) -> f64 {
    let m = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
    let sum: f64 = row.iter().map(|&v| (f64::from(v) - m).exp()).sum();
    f64::from(row[i]) - m - sum.ln()
}

/// First index of the largest value.
fn first_argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

pub(crate) fn check_argmax(dev: &Device, rng: &mut Rng, rep: &mut Report) -> Res {
    let s = &dev.stream;
    for vocab in [49152usize, 128_256] {
        let rows = 5;
        let mut logits = rng.vec(rows * vocab, 4.0);
        let unique = rng.below(vocab);
        logits[unique] = 9.0; // row 0: a unique maximum
        for i in [300, 5000] {
            logits[vocab + i] = 9.0; // row 1: a tie across warps (300 wins)
        }
        for i in [7, 7 + 1024, vocab - 1] {
            logits[2 * vocab + i] = 9.0; // row 2: a tie within one thread's stride and at the end (7 wins)
        }
        logits[3 * vocab + vocab - 1] = 9.0; // row 3: the maximum at the last index; row 4: as drawn
        let dl = s.clone_htod(&logits)?;
        let mut tok = s.clone_htod(&vec![-1i32; rows + TAIL])?;
        let mut lp = nan_buf(s, rows + TAIL)?;
        dev.argmax(&dl.as_view(), rows, vocab, &mut tok.as_view_mut(), &mut lp.as_view_mut())?;
        let (got_tok, got_lp) = (read(s, &tok)?, read(s, &lp)?);
        let want_tok: Vec<usize> = (0..rows).map(|r| first_argmax(&logits[r * vocab..(r + 1) * vocab])).collect();
        let wrong = (0..rows).filter(|&r| got_tok[r] != want_tok[r] as i32).count();
        let want_lp: Vec<f64> = (0..rows).map(|r| log_softmax_at(&logits[r * vocab..(r + 1) * vocab], want_tok[r])).collect();
        let stray = got_tok[rows..].iter().filter(|&&t| t != -1).count();
        let c =
            compare(&got_lp[..rows], &want_lp).tail(&got_lp[rows..]).flag(wrong, "wrong tokens").flag(stray, "tokens written past the end");
        rep.single(format!("argmax_logprob vocab {vocab} (ties: first)"), F32_LIMIT, c);

        // Advancing: the same picks, and each row's next inputs (the pick as the id, the position
        // plus one), nothing written past the rows.
        let mut tok = s.clone_htod(&vec![-1i32; rows + TAIL])?;
        let mut lp = nan_buf(s, rows + TAIL)?;
        let mut ids = s.clone_htod(&vec![-1i32; rows + TAIL])?;
        let start: Vec<i32> = (0..rows + TAIL).map(|r| 100 + r as i32).collect();
        let mut positions = s.clone_htod(&start)?;
        let next = Some((&mut ids.as_view_mut(), &mut positions.as_view_mut()));
        dev.argmax_advancing(&dl.as_view(), rows, vocab, &mut tok.as_view_mut(), &mut lp.as_view_mut(), next)?;
        let (got_tok, got_lp, got_ids, got_pos) = (read(s, &tok)?, read(s, &lp)?, read(s, &ids)?, read(s, &positions)?);
        let wrong =
            (0..rows).filter(|&r| got_tok[r] != want_tok[r] as i32 || got_ids[r] != got_tok[r] || got_pos[r] != start[r] + 1).count();
        let stray = (rows..rows + TAIL).filter(|&r| got_tok[r] != -1 || got_ids[r] != -1 || got_pos[r] != start[r]).count();
        let c = compare(&got_lp[..rows], &want_lp)
            .tail(&got_lp[rows..])
            .flag(wrong, "wrong tokens or next inputs")
            .flag(stray, "written past the end");
        rep.single(format!("argmax_logprob vocab {vocab}, advancing the next step's inputs"), F32_LIMIT, c);
    }
    check_argmax_without_maximum(dev, rep)
}

/// Rows with no maximum pick token 0 (the host argmax's choice), never an index past the vocabulary
/// (a decode pass feeds its picks to the next step's embedding gather): every logit NaN, every logit
/// -inf; and NaN beside one finite logit picks that one.
fn check_argmax_without_maximum(dev: &Device, rep: &mut Report) -> Res {
    let s = &dev.stream;
    let vocab = 49152usize;
    let mut logits = vec![f32::NAN; vocab];
    logits.extend(vec![f32::NEG_INFINITY; vocab]);
    let mut third = vec![f32::NAN; vocab];
    third[777] = 1.5;
    logits.extend(third);
    let want = [0i32, 0, 777];
    let rows = want.len();
    let dl = s.clone_htod(&logits)?;
    let mut tok = s.clone_htod(&vec![-1i32; rows])?;
    let mut lp = nan_buf(s, rows)?;
    dev.argmax(&dl.as_view(), rows, vocab, &mut tok.as_view_mut(), &mut lp.as_view_mut())?;
    let got = read(s, &tok)?;
    let wrong = (0..rows).filter(|&r| got[r] != want[r]).count();
    let c = compare(&[], &[]).flag(wrong, "tokens other than 0, 0, 777");
    rep.single("argmax_logprob rows without a maximum (all NaN, all -inf, NaN beside one value)", F32_LIMIT, c);
    Ok(())
}

/// The host sampler's kept set at temperature `t`: the most probable tokens whose mass first reaches
/// `top_p`, with their renormalised probabilities, and the cut's margin (distance of top_p from the
/// mass just before and at the cut; small margins make the test ambiguous, not the kernel wrong).
fn kept_set(row: &[f32], t: f64, top_p: f64) -> (Vec<(usize, f64)>, f64) {
    let m = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
    let p: Vec<f64> = row.iter().map(|&v| ((f64::from(v) - m) / t).exp()).collect();
    let total: f64 = p.iter().sum();
    let mut order: Vec<usize> = (0..row.len()).collect();
    order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
    let (mut cum, mut kept) = (0.0, Vec::new());
    for &i in &order {
        let before = cum;
        cum += p[i] / total;
        kept.push(i);
        if cum >= top_p {
            let margin = (top_p - before).min(cum - top_p);
            let mass: f64 = kept.iter().map(|&k| p[k]).sum();
            return (kept.iter().map(|&k| (k, p[k] / mass)).collect(), margin);
        }
    }
    let mass: f64 = kept.iter().map(|&k| p[k]).sum();
    (kept.iter().map(|&k| (k, p[k] / mass)).collect(), 0.0)
}

/// One top_p_sample launch over the rows of `logits` (one row per entry of `temps`): tokens, logprobs
/// and the count of outputs written past the end.
fn top_p_launch(
    dev: &Device,
    logits: &[f32],
    vocab: usize,
    temps: &[f32],
    top_ps: &[f32],
    uniforms: &[f32],
) -> Res<(Vec<i32>, Vec<f32>, usize)> {
    let s = &dev.stream;
    let rows = temps.len();
    let (dl, dt, dp, du) = (s.clone_htod(logits)?, s.clone_htod(temps)?, s.clone_htod(top_ps)?, s.clone_htod(uniforms)?);
    let mut tok = s.clone_htod(&vec![-1i32; rows + TAIL])?;
    let mut lp = nan_buf(s, rows + TAIL)?;
    dev.top_p(&dl.as_view(), rows, vocab, (&dt.as_view(), &dp.as_view(), &du.as_view()), &mut tok.as_view_mut(), &mut lp.as_view_mut())?;
    let (got_tok, got_lp) = (read(s, &tok)?, read(s, &lp)?);
    let stray = got_tok[rows..].iter().filter(|&&t| t != -1).count() + got_lp[rows..].iter().filter(|v| !v.is_nan()).count();
    Ok((got_tok[..rows].to_vec(), got_lp[..rows].to_vec(), stray))
}

pub(crate) fn check_top_p(dev: &Device, rng: &mut Rng, rep: &mut Report) -> Res {
    let vocab = 49152usize;
    // Every drawn token's reported log-probability (temperature 1), over all the cases below.
    let (mut lp_got, mut lp_want, mut lp_bad) = (Vec::new(), Vec::new(), 0usize);
    let mut record_lp = |logits: &[f32], vocab: usize, tokens: &[i32], lps: &[f32]| {
        for (r, (&t, &lp)) in tokens.iter().zip(lps).enumerate() {
            if t >= 0 && (t as usize) < vocab {
                lp_got.push(lp);
                lp_want.push(log_softmax_at(&logits[r * vocab..(r + 1) * vocab], t as usize));
            } else {
                lp_bad += 1;
            }
        }
    };

    // (a) top_p 1e-6 keeps only the most probable token, whatever the uniform and temperature.
    let rows = 8;
    let mut logits = rng.vec(rows * vocab, 4.0);
    let mut argmax = Vec::with_capacity(rows);
    for r in 0..rows {
        let i = rng.below(vocab);
        logits[r * vocab + i] = 6.0;
        argmax.push(i as i32);
    }
    let temps = [0.5f32, 0.7, 1.0, 1.3, 1.0, 0.9, 1.1, 2.0];
    let uniforms = [0.0f32, 0.999, 0.5, 0.25, 0.75, 0.123, 0.9999, 0.6];
    let (tokens, lps, stray) = top_p_launch(dev, &logits, vocab, &temps, &[1e-6; 8], &uniforms)?;
    let wrong = tokens.iter().zip(&argmax).filter(|(a, b)| a != b).count();
    let mut c = Cmp { elems: rows, ..Cmp::default() }.flag(wrong, "not the argmax").flag(stray, "written past the end");
    c.why = if c.why.is_empty() { String::new() } else { format!("{} (got {tokens:?}, want {argmax:?})", c.why) };
    rep.single("top_p (a) top_p 1e-6 = argmax", 0.0, c);
    record_lp(&logits, vocab, &tokens, &lps);

    // (b) four dominant tokens over a faint background; every draw must land in the CPU's kept set,
    // with frequencies near the renormalised probabilities (stratified uniforms, 200 rows).
    let dominant = [(17usize, 2.0f32), (4099, 1.7), (30000, 1.5), (49151, 1.0)];
    let mut row_logits: Vec<f32> = (0..vocab).map(|_| -12.0 + rng.sym(2.0)).collect();
    for (i, v) in dominant {
        row_logits[i] = v;
    }
    let rows = 200;
    let logits: Vec<f32> = (0..rows).flat_map(|_| row_logits.iter().copied()).collect();
    for (t, top_p) in [(1.0f32, 0.5f32), (1.0, 0.75), (0.8, 0.9)] {
        let (kept, margin) = kept_set(&row_logits, f64::from(t), f64::from(top_p));
        let uniforms: Vec<f32> = (0..rows).map(|i| ((i as f64 + rng.unit()) / rows as f64) as f32).collect();
        let (tokens, lps, stray) = top_p_launch(dev, &logits, vocab, &vec![t; rows], &vec![top_p; rows], &uniforms)?;
        let outside = tokens.iter().filter(|&&tok| !kept.iter().any(|&(k, _)| k as i32 == tok)).count();
        let mut worst_freq = 0f64;
        for &(k, p) in &kept {
            let freq = tokens.iter().filter(|&&tok| tok == k as i32).count() as f64 / rows as f64;
            worst_freq = worst_freq.max((freq - p).abs());
        }
        let mut row = Row::new(format!("top_p (b) t {t} top_p {top_p}: kept set of {}", kept.len()), 0.03);
        // The table's "rel err" column holds the largest |frequency - probability| here.
        let c = Cmp { elems: rows, rel: worst_freq, ..Cmp::default() }
            .flag(outside, "draws outside the kept set")
            .flag(stray, "written past the end");
        row.add(&format!("cut margin {margin:.3}, worst |freq - p| {worst_freq:.3}"), c);
        rep.rows.push(row);
        record_lp(&logits, vocab, &tokens, &lps);
    }

    // (d) top_p 1.0 over a 128256 vocabulary: any token, still with its log-probability.
    let (big, rows) = (128_256usize, 4usize);
    let logits = rng.vec(rows * big, 3.0);
    let (tokens, lps, stray) = top_p_launch(dev, &logits, big, &[1.0; 4], &[1.0; 4], &[0.1, 0.4, 0.7, 0.95])?;
    record_lp(&logits, big, &tokens, &lps);

    let c = compare(&lp_got, &lp_want).flag(lp_bad, "tokens out of range").flag(stray, "written past the end");
    rep.single("top_p (c) logprob at t=1 vs f64", F32_LIMIT, c);
    Ok(())
}
