//! Host-side stub so `userspace` can name this crate as a build dependency; aya-build then
//! builds the real programs (`src/main.rs`) for the BPF target.
#![no_std]
