// A benchmark peer, not part of mlagen: a torch op around FlashAttention-3's FP8 forward (hopper/ of
// Dao-AILab/flash-attention, vendored in <peers>/fa3) for d_qk 192 / d_v 128, e4m3 q / k / v, bf16 out,
// varlen (cu_seqlens), MHA (as many K/V heads as Q heads), causal (bottom-right) or not, fp32 descale
// factors per tensor ([1]) or per head ([H]), as mlagen's dense FP8 call takes them.
//
// The parameter filling follows the bf16 peer's binding (<peers>/fa3/csrc/peer/fa3_peer_api.cpp, itself a
// reduction of hopper/flash_api.cpp mha_fwd) with the FP8 fields set: is_e4m3, the descale pointers and their
// (batch, head) strides. One split, no paged KV, no softcap, no local window, no PackGQA.
#include <cmath>
#include <limits>
#include <optional>
#include <tuple>

#include <torch/library.h>
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime_api.h>

#include "flash.h"
#include "fa3_fp8_kernels.h"

namespace {

constexpr int kHeadDim = 192;
constexpr int kHeadDimV = 128;
constexpr int kPrepareMaxBatches1Cta = 992;  // hopper/flash_api.cpp PREPARE_VARLEN_MAX_BATCHES_1CTA

inline int round_multiple(int x, int m) { return (x + m - 1) / m * m; }

// A descale tensor ([1] or [H], fp32, on q's device) as FA3's (batch, kv-head) pointer and strides
// (batch stride 0: one factor per head for every sequence).
struct Descale {
    float* ptr = nullptr;
    int64_t head_stride = 0;
};

Descale descale(const std::optional<at::Tensor>& t, const char* name, int heads, const at::Tensor& q) {
    if (!t.has_value()) return {};
    const at::Tensor& d = t.value();
    TORCH_CHECK(d.scalar_type() == at::kFloat && d.dim() == 1 && (d.size(0) == 1 || d.size(0) == heads),
                name, " must be float32 of shape [1] or [", heads, "]");
    TORCH_CHECK(d.device() == q.device() && d.is_contiguous(), name, " must be contiguous on q's device");
    return {static_cast<float*>(d.data_ptr()), d.size(0) == 1 ? 0 : 1};
}

std::tuple<at::Tensor, at::Tensor> fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                                       int64_t max_seqlen_q, int64_t max_seqlen_k, bool causal,
                                       std::optional<double> softmax_scale_,
                                       const std::optional<at::Tensor>& q_descale,
                                       const std::optional<at::Tensor>& k_descale,
                                       const std::optional<at::Tensor>& v_descale) {
    TORCH_CHECK(q.is_cuda() && k.is_cuda() && v.is_cuda(), "q, k, v must be CUDA tensors");
    c10::cuda::CUDAGuard device_guard{q.device()};
    int major = 0, minor = 0, sms = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, q.get_device()));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, q.get_device()));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, q.get_device()));
    TORCH_CHECK(major == 9 && minor == 0, "fa3_fp8: only sm_90a kernels are built");
    for (const at::Tensor* t : {&q, &k, &v}) {
        TORCH_CHECK(t->scalar_type() == at::ScalarType::Float8_e4m3fn, "fa3_fp8: q, k, v must be float8_e4m3fn");
        TORCH_CHECK(t->dim() == 3 && t->stride(-1) == 1, "fa3_fp8: q, k, v must be [tokens, heads, dim], last dim contiguous");
    }
    TORCH_CHECK(cu_seqlens_q.scalar_type() == at::kInt && cu_seqlens_k.scalar_type() == at::kInt &&
                cu_seqlens_q.is_contiguous() && cu_seqlens_k.is_contiguous() &&
                cu_seqlens_q.numel() == cu_seqlens_k.numel() && cu_seqlens_q.numel() >= 2,
                "fa3_fp8: cu_seqlens_q / cu_seqlens_k must be contiguous int32 [B + 1]");
    const int batch = cu_seqlens_q.numel() - 1;
    const int total_q = q.size(0), total_k = k.size(0), heads = q.size(1);
    TORCH_CHECK(q.size(2) == kHeadDim && k.size(2) == kHeadDim && v.size(2) == kHeadDimV,
                "fa3_fp8: head dims must be q/k 192, v 128");
    TORCH_CHECK(k.size(1) == heads && v.size(1) == heads && v.size(0) == total_k,
                "fa3_fp8: MHA only (k and v with q's head count and one token count)");
    int seqlen_q = static_cast<int>(max_seqlen_q);
    const int seqlen_k = static_cast<int>(max_seqlen_k);
    if (seqlen_q == 1) causal = false;  // as mha_fwd: causal is the same as non-causal for one query row

    auto out = at::empty({total_q, heads, kHeadDimV}, q.options().dtype(at::kBFloat16));
    auto lse = at::empty({heads, total_q}, q.options().dtype(at::kFloat));

    Flash_fwd_params params{};
    params.is_bf16 = false;
    params.is_e4m3 = true;
    params.q_ptr = q.data_ptr();
    params.k_ptr = k.data_ptr();
    params.v_ptr = v.data_ptr();
    params.q_row_stride = q.stride(0);
    params.k_row_stride = k.stride(0);
    params.v_row_stride = v.stride(0);
    params.q_head_stride = q.stride(1);
    params.k_head_stride = k.stride(1);
    params.v_head_stride = v.stride(1);
    params.v_dim_stride = v.stride(2);
    params.o_ptr = out.data_ptr();
    params.o_row_stride = out.stride(0);
    params.o_head_stride = out.stride(1);
    params.cu_seqlens_q = static_cast<int*>(cu_seqlens_q.data_ptr());
    params.cu_seqlens_k = static_cast<int*>(cu_seqlens_k.data_ptr());
    params.softmax_lse_ptr = lse.data_ptr();
    params.b = batch;
    params.b_k = batch;
    params.h = heads;
    params.h_k = heads;
    params.seqlen_q = seqlen_q;
    params.seqlen_k = seqlen_k;
    params.seqlen_q_rounded = round_multiple(seqlen_q, 128);
    params.seqlen_k_rounded = round_multiple(seqlen_k, 128);
    params.d = kHeadDim;
    params.d_rounded = kHeadDim;
    params.dv = kHeadDimV;
    params.dv_rounded = kHeadDimV;
    params.total_q = total_q;
    params.total_k = total_k;
    params.scale_softmax = static_cast<float>(softmax_scale_.value_or(1.0 / std::sqrt(double(kHeadDim))));
    params.softcap = 0.f;
    params.p_dropout = 1.f;
    params.p_dropout_in_uint8_t = 255;
    params.rp_dropout = 1.f;
    params.is_causal = causal;
    params.is_local = false;
    params.window_size_left = seqlen_k - 1;
    params.window_size_right = causal ? 0 : seqlen_q - 1;
    params.attention_chunk = 0;
    params.arch = major * 10 + minor;
    params.num_sm = sms;
    params.page_size = 1;
    params.num_pages = 0;
    params.pagedkv_tma = false;
    params.num_splits = 1;
    params.pack_gqa = false;
    params.rotary_dim = 0;
    const Descale dq = descale(q_descale, "q_descale", heads, q);
    const Descale dk = descale(k_descale, "k_descale", heads, q);
    const Descale dv = descale(v_descale, "v_descale", heads, q);
    params.q_descale_ptr = dq.ptr;
    params.q_descale_head_stride = dq.head_stride;
    params.k_descale_ptr = dk.ptr;
    params.k_descale_head_stride = dk.head_stride;
    params.v_descale_ptr = dv.ptr;
    params.v_descale_head_stride = dv.head_stride;

    // Varlen: the scheduler's metadata (prepare_varlen_num_blocks runs inside run_flash_fwd), sorted batches,
    // the head swizzle for causal, and the tile semaphore, laid out as mha_fwd lays them out.
    params.prepare_varlen_pdl = params.b <= kPrepareMaxBatches1Cta;
    params.varlen_sort_batches = true;
    params.head_swizzle = causal;
    const int b_rounded = round_multiple(params.b, 4);
    const int vectors = 2 + 1 + (params.head_swizzle ? 1 : 0);
    const int head_swizzle_offset = b_rounded * 3;
    const int semaphore_offset = b_rounded * vectors;
    auto meta = at::empty({semaphore_offset + 1}, q.options().dtype(at::kInt));
    int* base = static_cast<int*>(meta.data_ptr());
    params.skip_scheduler_metadata_computation = false;
    params.num_splits_dynamic_ptr = base;
    params.num_m_blocks_ptr = base + b_rounded;
    params.varlen_batch_idx_ptr = base + b_rounded * 2;
    params.num_nheads_in_l2_ptr = params.head_swizzle ? base + head_swizzle_offset : nullptr;
    params.tile_count_semaphore = base + semaphore_offset;
    params.tile_count_semaphore_offset = semaphore_offset;

    if (total_q > 0 && total_k > 0) {
        auto stream = c10::cuda::getCurrentCUDAStream().stream();
        causal ? fa3_fp8_fwd_causal_varlen(params, stream) : fa3_fp8_fwd_noncausal_varlen(params, stream);
    } else if (total_q > 0) {
        out.zero_();
        lse.fill_(std::numeric_limits<float>::infinity());
    }
    return {out, lse};
}

}  // namespace

TORCH_LIBRARY(fa3_fp8, m) {
    m.def("fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, "
          "int max_seqlen_k, bool causal=False, float? softmax_scale=None, Tensor? q_descale=None, "
          "Tensor? k_descale=None, Tensor? v_descale=None) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(fa3_fp8, CUDA, m) {
    m.impl("fwd", &fwd);
}
