//! Expected errors, run last: every wrapper must refuse a shape its kernel cannot take, and after all
//! the launches the stream and context must synchronize clean.

use ctxscope_kernels::blas::{Activations, Blas, Compute};
use ctxscope_kernels::cudarc::driver::DevicePtr;
use ctxscope_kernels::device::{AttentionShape, Device, DeviceError, GemvMode, Matrix, RopeShape};

use crate::report::{nan_buf, Cmp, Report, Res, Row};
use crate::rng::Rng;

/// Every wrapper must refuse a shape its kernel cannot take (an error, not a launch).
pub(crate) fn check_shapes(dev: &Device, _rng: &mut Rng, rep: &mut Report) -> Res {
    let s = &dev.stream;
    let mut row = Row::new("wrapper shape checks (each must be an error)", 0.0);
    let mut expect_err = |what: &str, r: Result<(), DeviceError>| {
        let accepted = usize::from(r.is_ok());
        row.add(what, Cmp { elems: 1, ..Cmp::default() }.flag(accepted, "accepted"));
    };
    let big = nan_buf(s, 1 << 16)?;
    let mut out = nan_buf(s, 1 << 16)?;
    let m16 = Matrix::upload(s, &vec![0.5; 16 * 16], 16, 16, true)?;
    let m_cols12 = Matrix::upload(s, &vec![0.5; 16 * 12], 16, 12, true)?;
    let m_odd = Matrix::upload(s, &vec![0.5; 15 * 16], 15, 16, false)?;
    expect_err("gemv n=9", dev.gemv(&m16, &big.as_view(), &mut out.as_view_mut(), 9, GemvMode::Store, false));
    expect_err("gemv n=0", dev.gemv(&m16, &big.as_view(), &mut out.as_view_mut(), 0, GemvMode::Store, false));
    expect_err("gemv cols 12", dev.gemv(&m_cols12, &big.as_view(), &mut out.as_view_mut(), 1, GemvMode::Store, false));
    expect_err("gemv SwiGlu odd rows", dev.gemv(&m_odd, &big.as_view(), &mut out.as_view_mut(), 1, GemvMode::SwiGlu, false));
    expect_err("gemv y short", dev.gemv(&m16, &big.as_view(), &mut out.slice_mut(0..2 * 16 - 1), 2, GemvMode::Store, false));
    expect_err("gemv x short", dev.gemv(&m16, &big.slice(0..2 * 16 - 1), &mut out.as_view_mut(), 2, GemvMode::Store, false));
    expect_err("rmsnorm w != dim", dev.rmsnorm(&big.as_view(), None, &big.slice(0..63), &mut out.as_view_mut(), 2, 64, 1e-5, false));
    expect_err("rmsnorm out short", dev.rmsnorm(&big.as_view(), None, &big.slice(0..64), &mut out.slice_mut(0..127), 2, 64, 1e-5, false));
    let rows = s.clone_htod(&[0i32, 1])?;
    expect_err(
        "rmsnorm row map short",
        dev.rmsnorm(&big.as_view(), Some(&rows.as_view()), &big.slice(0..64), &mut out.as_view_mut(), 3, 64, 1e-5, false),
    );
    expect_err("q8_blocks n=33", dev.q8_blocks(&mut out.as_view_mut(), 33));
    expect_err("swiglu out short", dev.swiglu(&big.as_view(), &mut out.slice_mut(0..99), 1, 100));
    expect_err("embed out short", dev.embed(&m16, &rows.as_view(), &mut out.slice_mut(0..31), 2));
    let bases = s.clone_htod(&[big.device_ptr(s).0; 2])?;
    let rope = RopeShape { n_layers: 1, heads: 2, kv_heads: 1, head_dim: 7, base: 10000.0, flags: 0, kv_scale: 1.0 };
    expect_err("rope_kv odd head_dim", dev.rope_kv(&mut out.as_view_mut(), &rows.as_view(), &bases.as_view(), 2, 0, &rope));
    let rope = RopeShape { head_dim: 8, ..rope };
    expect_err("rope_kv qkv short", dev.rope_kv(&mut out.slice_mut(0..2 * 32 - 1), &rows.as_view(), &bases.as_view(), 2, 0, &rope));
    let attn = AttentionShape { n_layers: 1, heads: 34, kv_heads: 2, head_dim: 64, window: 0 };
    let (mut po, mut pml) = (nan_buf(s, 1 << 14)?, nan_buf(s, 1 << 10)?);
    expect_err(
        "attn_decode group 17",
        dev.attn_decode(
            &big.as_view(),
            &rows.as_view(),
            &bases.as_view(),
            0,
            (&mut po.as_view_mut(), &mut pml.as_view_mut()),
            &mut out.as_view_mut(),
            1,
            1,
            0,
            &attn,
        ),
    );
    let attn = AttentionShape { heads: 4, kv_heads: 2, ..attn };
    expect_err(
        "attn_decode part_ml short",
        dev.attn_decode(
            &big.as_view(),
            &rows.as_view(),
            &bases.as_view(),
            0,
            (&mut po.as_view_mut(), &mut pml.slice_mut(0..2 * 4 * 2 * 2 - 1)),
            &mut out.as_view_mut(),
            2,
            2,
            0,
            &attn,
        ),
    );
    expect_err(
        "attn_decode splits 0",
        dev.attn_decode(
            &big.as_view(),
            &rows.as_view(),
            &bases.as_view(),
            0,
            (&mut po.as_view_mut(), &mut pml.as_view_mut()),
            &mut out.as_view_mut(),
            1,
            0,
            0,
            &attn,
        ),
    );
    let attn = AttentionShape { head_dim: 256, ..attn };
    expect_err("attn_prefill head_dim 256", dev.attn_prefill(&big.as_view(), big.device_ptr(s).0, 0, &mut out.as_view_mut(), 1, 0, &attn));
    let attn = AttentionShape { heads: 3, head_dim: 64, ..attn };
    expect_err(
        "attn_prefill heads % kv_heads",
        dev.attn_prefill(&big.as_view(), big.device_ptr(s).0, 0, &mut out.as_view_mut(), 1, 0, &attn),
    );
    expect_err(
        "argmax logits short",
        dev.argmax(&big.slice(0..2 * 100 - 1), 2, 100, &mut s.clone_htod(&[0i32; 2])?.as_view_mut(), &mut out.as_view_mut()),
    );
    expect_err("Matrix::upload count", Matrix::upload(s, &[0.0; 10], 3, 3, false).map(|_| ()));
    let blas = Blas::new(s.clone())?;
    let bits = s.clone_htod(&[0u16; 64])?;
    let mf = Matrix::upload(s, &vec![0.5; 16 * 16], 16, 16, false)?;
    let bits_view = bits.as_view();
    expect_err(
        "matmul f32 weights, bf16 x",
        blas.matmul(&mf, Activations::Bf16(&bits_view), &mut out.as_view_mut(), 1, Compute::F32, false),
    );
    rep.rows.push(row);
    Ok(())
}

/// After every launch above, the stream must be clean: a fault would have surfaced at a read, but a
/// final synchronize makes sure nothing is pending.
pub(crate) fn check_sticky(dev: &Device, _rng: &mut Rng, rep: &mut Report) -> Res {
    dev.stream.synchronize()?;
    dev.ctx.synchronize()?;
    rep.single("stream and context synchronize clean", 0.0, Cmp::default());
    Ok(())
}
