//! The driver's compiled pipelines kept on disk (a `VkPipelineCache`), so that a second run
//! starts without compiling its kernels again.
//!
//! One entry per device and driver in core's [`DiskCache`] folder (`vulkan/`), named by the
//! vendor, device, driver version and the driver's cache UUID; the driver checks the same in
//! the data's own header and starts empty where it does not match. The cache is read when the
//! device opens, and written after kernels are compiled (at most every [`SAVE_INTERVAL`], the
//! writes of a burst of compiles folded into one) and when the device closes: a program that
//! keeps its device to the end (a test's static, say) loses at most the last interval's
//! kernels. Two processes writing at once leave one whole file (the later one's).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ash::vk;
use tessera_core::exec::DiskCache;
use tessera_core::Result;

use crate::memory::{lock, vk_err, Shared};

pub(crate) struct DriverCache {
    pub(crate) handle: vk::PipelineCache,
    /// Where it is kept, if the disk cache is on.
    entry: Option<(DiskCache, String)>,
    /// Whether a pipeline was created through it since it was last written.
    grown: AtomicBool,
    /// When it was last written; held while writing.
    saved: Mutex<Instant>,
    shared: Arc<Shared>,
}

impl DriverCache {
    /// The cache of the device with `props`, holding what an earlier run left.
    pub(crate) fn open(
        shared: &Arc<Shared>,
        props: &vk::PhysicalDeviceProperties,
    ) -> Result<DriverCache> {
        let uuid: String = props
            .pipeline_cache_uuid
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let name = format!(
            "{:04x}-{:04x}-{:08x}-{uuid}.bin",
            props.vendor_id, props.device_id, props.driver_version
        );
        let entry = DiskCache::for_backend("vulkan").map(|cache| (cache, name));
        let initial = entry
            .as_ref()
            .and_then(|(cache, name)| cache.load(name))
            .unwrap_or_default();
        let info = vk::PipelineCacheCreateInfo::default().initial_data(&initial);
        // SAFETY: the device is valid; `initial` is empty or a whole entry this backend
        // wrote from `vkGetPipelineCacheData` (checked by length and checksum), which the
        // driver validates again by its header.
        let handle = unsafe { shared.device.create_pipeline_cache(&info, None) }
            .map_err(|e| vk_err("vkCreatePipelineCache", e))?;
        Ok(DriverCache {
            handle,
            entry,
            grown: AtomicBool::new(false),
            saved: Mutex::new(Instant::now()),
            shared: shared.clone(),
        })
    }

    /// Notes that a pipeline was created through the cache, and writes it if the last write
    /// is older than [`SAVE_INTERVAL`].
    pub(crate) fn grew(&self) {
        self.grown.store(true, Ordering::Relaxed);
        let mut saved = lock(&self.saved);
        if saved.elapsed() >= SAVE_INTERVAL {
            self.save();
            *saved = Instant::now();
        }
    }

    /// Writes the cache to disk if it grew since the last write. The caller holds `saved`.
    fn save(&self) {
        let Some((cache, name)) = &self.entry else {
            return;
        };
        if !self.grown.swap(false, Ordering::Relaxed) {
            return;
        }
        // SAFETY: the cache belongs to this device; the driver synchronizes it against
        // pipelines being created through it on other threads.
        if let Ok(data) = unsafe { self.shared.device.get_pipeline_cache_data(self.handle) } {
            cache.store(name, &data);
        }
    }
}

/// The least time between two writes of the cache while kernels are being compiled.
const SAVE_INTERVAL: Duration = Duration::from_secs(2);

impl Drop for DriverCache {
    fn drop(&mut self) {
        let _saving = lock(&self.saved);
        self.save();
        // SAFETY: the cache belongs to this device and nothing uses it any more (its owner is
        // being dropped); pipelines created through a cache do not need it to live on.
        unsafe { self.shared.device.destroy_pipeline_cache(self.handle, None) };
    }
}
