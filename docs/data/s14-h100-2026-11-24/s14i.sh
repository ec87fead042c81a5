#!/usr/bin/env bash
# Session 14 H100 call i: Nsight Compute on the shipped fp8-mode kernel (927c246), with session 13's
# call-j script unchanged (the fp8_v32 and fp8_b0 caches and the bf16 kernel on the copy).
exec bash docs/data/s13-h100-2026-11-24/s13j.sh
