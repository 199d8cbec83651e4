//! Kernel profiling (`Device::set_profiling`, `tessera bench --profile`) on every device under
//! test: each launch is counted under its kernel with a device time, starting again clears the
//! totals, and stopping keeps them. A device without timestamps says `Unsupported`.

use tessera::{Error, Tensor};
use tessera_conformance::devices_under_test;

#[test]
fn profiling_counts_every_launch_of_each_kernel() {
    for device in devices_under_test() {
        let id = device.info().id();
        match device.set_profiling(true) {
            Ok(()) => {}
            Err(Error::Unsupported { .. }) => {
                assert!(
                    device.profile().is_empty(),
                    "{id}: a profile without profiling"
                );
                continue;
            }
            Err(e) => panic!("{id}: {e}"),
        }
        let values: Vec<f32> = (0..64).map(|i| i as f32 / 8.0).collect();
        let a = Tensor::from_slice(&values, &[8, 8], &device).unwrap();
        let product = a.matmul(&a).unwrap();
        let mut sum = product.clone();
        for _ in 0..3 {
            sum = sum.add(&product).unwrap();
        }
        let _ = sum.to_vec_f64().unwrap();
        device.set_profiling(false).unwrap();
        let profile = device.profile();
        let launches = |name: &str| -> u64 {
            profile
                .iter()
                .filter(|k| k.name.contains(name))
                .map(|k| k.launches)
                .sum()
        };
        assert!(launches("Matmul") >= 1, "{id}: no matmul in {profile:?}");
        assert!(
            launches("Add") >= 3,
            "{id}: fewer than 3 adds in {profile:?}"
        );
        assert!(
            profile.iter().all(|k| k.seconds >= 0.0 && k.seconds < 10.0),
            "{id}: {profile:?}"
        );
        assert!(
            profile.windows(2).all(|w| w[0].seconds >= w[1].seconds),
            "{id}: not slowest first: {profile:?}"
        );
        assert_eq!(device.profile(), profile, "{id}: stopping kept the totals");
        device.set_profiling(true).unwrap();
        assert!(
            device.profile().is_empty(),
            "{id}: starting again clears the totals"
        );
        device.set_profiling(false).unwrap();
    }
}
