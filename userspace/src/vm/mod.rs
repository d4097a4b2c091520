//! Virtual machines on the host: which processes are VMs (qemu/KVM, libvirt, Firecracker,
//! cloud-hypervisor, KubeVirt), which of their threads are vCPUs, and each VM's energy in a
//! window (docs/virtual-machines.md, "On the host").
//!
//! - [`detect`]: pure recognition from a process's arguments, name and cgroup path, and of
//!   its threads from their names;
//! - [`energy`]: pure per-VM energy of a window, from the pipeline's process rows and its
//!   static energy under a [`StaticPolicy`];
//! - [`proc`]: the live side, `/proc` reads of a VM process (its arguments as the kernel
//!   split them, start time, threads, group).

pub(crate) mod detect;
pub(crate) mod energy;
pub(crate) mod proc;
pub(crate) mod rows;

pub(crate) use detect::{Hypervisor, ThreadClass};
pub(crate) use energy::{StaticPolicy, VmEnergy};
