//! NVIDIA GPUs through NVML, loaded at run time (`libnvidia-ml.so.1`; no link-time
//! dependency, so the binary runs on machines without the driver).
//!
//! Energy: `nvmlDeviceGetTotalEnergyConsumption`, mJ since the driver loaded (Volta and
//! newer), a 64-bit counter, updated every 20–100 ms (docs/ARCHITECTURE.md, "Energy counters": average over ≥ 5 update
//! periods). Per-process use for attribution: `nvmlDeviceGetProcessUtilization` (SM % per
//! process since the last call) and `nvmlDeviceGetComputeRunningProcesses_v3` (memory).
//!
//! What a read costs (an H100 guest, driver 580, per call): the energy counter 3.8–4.2 ms of
//! CPU, the per-process utilisation 2.5 ms, the process lists 0.01–0.14 ms. A read lists
//! the processes first and asks for their utilisation only when some process is there: an
//! idle GPU's reads cost the energy call alone.

use std::{
    collections::BTreeMap,
    ffi::{CStr, c_char, c_int, c_uint, c_ulonglong, c_void},
    sync::Arc,
};

use super::{EnergyError, EnergySource, RawSample, SourceKind, source_desc};
use crate::pb::v1 as pb;

/// The library file NVML is loaded from.
const LIBRARY: &str = "libnvidia-ml.so.1";

type Ret = c_int;
type Device = *mut c_void;
const NVML_SUCCESS: Ret = 0;
const NVML_ERROR_INSUFFICIENT_SIZE: Ret = 7;

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct UtilSample {
    pid: c_uint,
    time_stamp: c_ulonglong,
    sm_util: c_uint,
    mem_util: c_uint,
    enc_util: c_uint,
    dec_util: c_uint,
}

/// `nvmlProcessInfo_t` (v3 layout of `nvmlDeviceGetComputeRunningProcesses_v3`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct ProcessInfo {
    pid: c_uint,
    used_gpu_memory: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

/// `nvmlDeviceGet{Compute,Graphics}RunningProcesses_v3`.
type ListProcesses = unsafe extern "C" fn(Device, *mut c_uint, *mut ProcessInfo) -> Ret;

struct Api {
    // Function pointers stay valid while `_lib` is loaded; both live in this struct.
    shutdown: unsafe extern "C" fn() -> Ret,
    error_string: unsafe extern "C" fn(Ret) -> *const c_char,
    count: unsafe extern "C" fn(*mut c_uint) -> Ret,
    handle: unsafe extern "C" fn(c_uint, *mut Device) -> Ret,
    name: unsafe extern "C" fn(Device, *mut c_char, c_uint) -> Ret,
    energy: unsafe extern "C" fn(Device, *mut c_ulonglong) -> Ret,
    utilization:
        Option<unsafe extern "C" fn(Device, *mut UtilSample, *mut c_uint, c_ulonglong) -> Ret>,
    processes: Option<ListProcesses>,
    graphics: Option<ListProcesses>,
    _lib: libloading::Library,
}

impl Api {
    fn error(&self, what: &str, ret: Ret) -> EnergyError {
        // SAFETY: nvmlErrorString returns a static NUL-terminated string for any code.
        let text = unsafe { CStr::from_ptr((self.error_string)(ret)) };
        EnergyError::Nvml(format!("{what}: {} (code {ret})", text.to_string_lossy()))
    }
}

impl Drop for Api {
    fn drop(&mut self) {
        // SAFETY: nvmlInit_v2 succeeded when this Api was built; every device handle is
        // held by a `Gpu` that keeps this Api alive, so none is used after shutdown.
        unsafe { (self.shutdown)() };
    }
}

fn load() -> Result<Api, EnergyError> {
    load_from(LIBRARY)
}

/// [`load`] from a given library file (tests point it at libraries that are not NVML).
fn load_from(library: &str) -> Result<Api, EnergyError> {
    // SAFETY: loading the NVIDIA management library runs its initialisers, which have no
    // preconditions; the symbols below are looked up with their documented signatures.
    unsafe {
        let lib = libloading::Library::new(library).map_err(|e| {
            EnergyError::Nvml(format!(
                "no NVIDIA GPU/driver ({library} not loadable: {e})"
            ))
        })?;
        macro_rules! sym {
            ($name:literal) => {
                *lib.get($name).map_err(|e| {
                    EnergyError::Nvml(format!(
                        "{library} lacks {}: {e}",
                        String::from_utf8_lossy($name)
                    ))
                })?
            };
        }
        let init: unsafe extern "C" fn() -> Ret = sym!(b"nvmlInit_v2");
        let api = Api {
            shutdown: sym!(b"nvmlShutdown"),
            error_string: sym!(b"nvmlErrorString"),
            count: sym!(b"nvmlDeviceGetCount_v2"),
            handle: sym!(b"nvmlDeviceGetHandleByIndex_v2"),
            name: sym!(b"nvmlDeviceGetName"),
            energy: sym!(b"nvmlDeviceGetTotalEnergyConsumption"),
            utilization: lib.get(b"nvmlDeviceGetProcessUtilization").ok().map(|s| *s),
            processes: lib
                .get(b"nvmlDeviceGetComputeRunningProcesses_v3")
                .ok()
                .map(|s| *s),
            graphics: lib
                .get(b"nvmlDeviceGetGraphicsRunningProcesses_v3")
                .ok()
                .map(|s| *s),
            _lib: lib,
        };
        let ret = init();
        if ret != NVML_SUCCESS {
            // Not initialised: do not call nvmlShutdown on drop.
            let err = api.error("nvmlInit_v2 failed (NVIDIA driver not loaded?)", ret);
            std::mem::forget(api);
            return Err(err);
        }
        Ok(api)
    }
}

/// One GPU's energy counter.
pub struct Gpu {
    api: Arc<Api>,
    device: Device,
    desc: pb::EnergySource,
    last_seen_us: u64,
}

// SAFETY: NVML is documented thread-safe; `device` is an opaque handle valid until
// nvmlShutdown, which only runs when the last `Arc<Api>` (one held here) drops.
unsafe impl Send for Gpu {}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("desc", &self.desc)
            .finish_non_exhaustive()
    }
}

/// Opens every GPU whose energy counter answers. `Err` when NVML is absent or has no
/// usable GPU (the reason says which).
pub fn open() -> Result<Vec<Gpu>, EnergyError> {
    let api = Arc::new(load()?);
    let mut n: c_uint = 0;
    // SAFETY: `n` is a valid out-pointer.
    let ret = unsafe { (api.count)(&mut n) };
    if ret != NVML_SUCCESS {
        return Err(api.error("nvmlDeviceGetCount_v2", ret));
    }
    if n == 0 {
        return Err(EnergyError::Nvml(
            "NVIDIA driver loaded but no GPU present".into(),
        ));
    }
    let mut gpus = Vec::new();
    let mut reasons = Vec::new();
    for index in 0..n {
        let mut device: Device = std::ptr::null_mut();
        // SAFETY: `device` is a valid out-pointer; index < count.
        let ret = unsafe { (api.handle)(index, &mut device) };
        if ret != NVML_SUCCESS {
            reasons.push(api.error(&format!("GPU {index}: nvmlDeviceGetHandleByIndex_v2"), ret));
            continue;
        }
        let mut buf = [0 as c_char; 96];
        // SAFETY: `buf` holds 96 chars, the size passed; NVML NUL-terminates within it.
        let name = if unsafe { (api.name)(device, buf.as_mut_ptr(), buf.len() as c_uint) }
            == NVML_SUCCESS
        {
            // SAFETY: NUL-terminated by NVML on success.
            unsafe { CStr::from_ptr(buf.as_ptr()) }
                .to_string_lossy()
                .into_owned()
        } else {
            "NVIDIA GPU".to_owned()
        };
        let mut mj: c_ulonglong = 0;
        // SAFETY: valid handle and out-pointer.
        let ret = unsafe { (api.energy)(device, &mut mj) };
        if ret != NVML_SUCCESS {
            reasons.push(api.error(&format!("GPU {index} ({name}): total energy"), ret));
            continue;
        }
        let desc = source_desc(
            SourceKind::Nvml,
            pb::EnergyDomain::Gpu,
            index,
            format!("GPU {index} ({name})"),
        );
        gpus.push(Gpu {
            api: api.clone(),
            device,
            desc,
            last_seen_us: 0,
        });
    }
    if gpus.is_empty() {
        let text: Vec<String> = reasons.iter().map(ToString::to_string).collect();
        return Err(EnergyError::Nvml(format!(
            "no GPU with an energy counter: {}",
            text.join("; ")
        )));
    }
    Ok(gpus)
}

impl Gpu {
    /// Per-process SM utilisation since the last call and memory in use. The utilisation
    /// (the costly call, see the module doc) is asked for only when a process is listed, or
    /// when the lists cannot say; skipped, its samples since `last_seen_us` wait for the
    /// next call.
    fn processes(&mut self) -> Vec<pb::GpuProcessUsage> {
        let mut by_pid: BTreeMap<u32, pb::GpuProcessUsage> = BTreeMap::new();
        // Compute processes give their memory; graphics ones only say the GPU is in use.
        let compute = self.api.processes.and_then(|f| self.list(f));
        let graphics = self.api.graphics.and_then(|f| self.list(f));
        for p in compute.iter().flatten() {
            let e = by_pid.entry(p.pid).or_insert(pb::GpuProcessUsage {
                pid: p.pid,
                ..Default::default()
            });
            // NVML_VALUE_NOT_AVAILABLE is all ones.
            e.used_memory_bytes = if p.used_gpu_memory == u64::MAX {
                0
            } else {
                p.used_gpu_memory
            };
        }
        if compute.is_some_and(|c| c.is_empty()) && graphics.is_some_and(|g| g.is_empty()) {
            return Vec::new();
        }
        if let Some(util) = self.api.utilization {
            let mut n: c_uint = 0;
            // SAFETY: a null buffer with n = 0 asks for the sample count.
            let ret = unsafe { util(self.device, std::ptr::null_mut(), &mut n, self.last_seen_us) };
            if (ret == NVML_ERROR_INSUFFICIENT_SIZE || ret == NVML_SUCCESS) && n > 0 {
                let mut samples = vec![UtilSample::default(); n as usize];
                // SAFETY: `samples` has room for `n` entries, the count passed.
                let ret =
                    unsafe { util(self.device, samples.as_mut_ptr(), &mut n, self.last_seen_us) };
                if ret == NVML_SUCCESS {
                    for s in samples.iter().take(n as usize) {
                        self.last_seen_us = self.last_seen_us.max(s.time_stamp);
                        let e = by_pid.entry(s.pid).or_insert(pb::GpuProcessUsage {
                            pid: s.pid,
                            ..Default::default()
                        });
                        e.sm_util = e.sm_util.max(s.sm_util);
                    }
                }
            }
        }
        by_pid.into_values().collect()
    }

    /// The processes `list` gives (`None` when the call fails).
    fn list(&self, list: ListProcesses) -> Option<Vec<ProcessInfo>> {
        let mut n: c_uint = 0;
        // SAFETY: a null buffer with n = 0 asks for the process count.
        let ret = unsafe { list(self.device, &mut n, std::ptr::null_mut()) };
        match ret {
            NVML_SUCCESS if n == 0 => Some(Vec::new()),
            NVML_SUCCESS | NVML_ERROR_INSUFFICIENT_SIZE => {
                // Processes may start between the two calls: leave room.
                n += 8;
                let mut infos = vec![ProcessInfo::default(); n as usize];
                // SAFETY: `infos` has room for `n` entries, the count passed.
                let ret = unsafe { list(self.device, &mut n, infos.as_mut_ptr()) };
                (ret == NVML_SUCCESS).then(|| {
                    infos.truncate(n as usize);
                    infos
                })
            }
            _ => None,
        }
    }
}

impl EnergySource for Gpu {
    fn describe(&self) -> pb::EnergySource {
        self.desc.clone()
    }

    fn unit_uj(&self) -> f64 {
        1000.0
    }

    fn wrap_counts(&self) -> Option<u64> {
        None
    }

    fn read(&mut self) -> Result<RawSample, EnergyError> {
        let mut mj: c_ulonglong = 0;
        // SAFETY: valid handle (see `unsafe impl Send`) and out-pointer.
        let ret = unsafe { (self.api.energy)(self.device, &mut mj) };
        if ret != NVML_SUCCESS {
            return Err(self.api.error(&self.desc.name, ret));
        }
        Ok(RawSample {
            count: mj,
            gpu_processes: self.processes(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ffi_struct_layouts_match_nvml_h() {
        // nvml.h: pid (4) + pad + timeStamp (8) + 4 × 4 = 32; pid + pad + 8 + 4 + 4 = 24.
        assert_eq!(std::mem::size_of::<UtilSample>(), 32);
        assert_eq!(std::mem::size_of::<ProcessInfo>(), 24);
    }

    #[test]
    fn a_missing_library_says_no_nvidia() {
        let Err(err) = load_from("/nonexistent/libnvidia-ml.so.1") else {
            panic!("a missing file loaded");
        };
        let text = err.to_string();
        assert!(text.contains("no NVIDIA GPU/driver"), "{text}");
        assert!(text.contains("/nonexistent/libnvidia-ml.so.1"), "{text}");
    }

    #[test]
    fn a_library_without_nvml_names_the_missing_symbol() {
        let Err(err) = load_from("libc.so.6") else {
            panic!("libc loaded as NVML");
        };
        let text = err.to_string();
        assert!(text.contains("lacks nvmlInit_v2"), "{text}");
    }

    #[test]
    fn open_matches_whether_the_driver_is_loaded() {
        // The kernel driver is the independent witness: with it, NVML must open and list
        // a GPU; without it, open must fail and say there is no NVIDIA GPU or driver.
        let driver = std::path::Path::new("/proc/driver/nvidia/version").exists();
        match open() {
            Ok(gpus) => {
                assert!(driver, "NVML opened without the NVIDIA kernel driver");
                assert!(!gpus.is_empty(), "open lists at least one GPU");
            }
            Err(e) => {
                assert!(!driver, "the NVIDIA driver is loaded but NVML failed: {e}");
                let text = e.to_string();
                assert!(text.contains("NVIDIA"), "{text}");
            }
        }
    }
}
