//! The one conversion hot enough to hand-vectorise: bytes (pixels) to
//! float32 tensors, `x * scale + offset`, written with non-temporal stores.
//!
//! # Why non-temporal stores
//! A feed writes every tensor once and nobody reads it before it has left
//! the cache (the consumer is `prefetch` batches behind, the GPU reads it by
//! DMA). Ordinary stores first read each destination line into the cache
//! (read-for-ownership), doubling memory traffic for a loop that is memory
//! bound: 3072 pixel bytes become 12 KiB of float32 per image.
//!
//! The vector loop computes `x * scale + offset` as a multiply then an add,
//! not a fused multiply-add, so every element rounds exactly like the scalar
//! head and tail (and like the same feed on any machine).

/// `dst[i] = src[i] as f32 * scale + offset` for `i < min(len)`.
pub(crate) fn u8_to_f32_affine(src: &[u8], dst: &mut [f32], scale: f32, offset: f32) {
    let n = src.len().min(dst.len());
    let (src, dst) = (&src[..n], &mut dst[..n]);
    #[cfg(target_arch = "x86_64")]
    if n >= 64 && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above), which is the
        // only requirement of `u8_to_f32_affine_avx2`.
        unsafe { u8_to_f32_affine_avx2(src, dst, scale, offset) };
        return;
    }
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = s as f32 * scale + offset;
    }
}

/// AVX2 body of [`u8_to_f32_affine`]; `src` and `dst` have equal lengths.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn u8_to_f32_affine_avx2(src: &[u8], dst: &mut [f32], scale: f32, offset: f32) {
    use std::arch::x86_64::{
        __m128i, _mm_loadl_epi64, _mm_sfence, _mm256_add_ps, _mm256_cvtepi32_ps,
        _mm256_cvtepu8_epi32, _mm256_mul_ps, _mm256_set1_ps, _mm256_stream_ps,
    };
    let n = src.len().min(dst.len());
    // Scalar head up to a 32-byte aligned destination (streaming stores
    // need it); slot buffers are page-aligned, so usually there is none.
    let head = dst.as_ptr().align_offset(32).min(n);
    for i in 0..head {
        dst[i] = src[i] as f32 * scale + offset;
    }
    let vscale = _mm256_set1_ps(scale);
    let voffset = _mm256_set1_ps(offset);
    let mut i = head;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n = len of both slices, so the 8 bytes read and
        // the 8 floats written are in bounds; `dst + i` is 32-byte aligned
        // (the head aligned it and i advances by 8 floats = 32 bytes).
        unsafe {
            let bytes = _mm_loadl_epi64(src.as_ptr().add(i).cast::<__m128i>());
            let values = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
            let scaled = _mm256_add_ps(_mm256_mul_ps(values, vscale), voffset);
            _mm256_stream_ps(dst.as_mut_ptr().add(i), scaled);
        }
        i += 8;
    }
    // Streaming stores are weakly ordered: fence before anyone (the
    // consumer thread, a DMA engine) may read them.
    _mm_sfence();
    for j in i..n {
        dst[j] = src[j] as f32 * scale + offset;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vector_and_scalar_paths_agree_bit_for_bit() {
        let src: Vec<u8> = (0..1000u32).map(|i| (i * 37 % 256) as u8).collect();
        for (start, len) in [(0, 1000), (3, 997), (1, 64), (5, 10)] {
            let mut dst = vec![0f32; 1001];
            // An odd offset into dst exercises the unaligned head.
            u8_to_f32_affine(
                &src[start..start + len],
                &mut dst[1..1 + len],
                1.0 / 255.0,
                -0.5,
            );
            for k in 0..len {
                let want = src[start + k] as f32 * (1.0 / 255.0) + -0.5;
                assert_eq!(dst[1 + k].to_bits(), want.to_bits(), "element {k}");
            }
        }
    }
}
