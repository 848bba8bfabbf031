//! Randomness of augmentation functions per epoch.
//!
//! `image_random_crop(img, h, w, seed)` and `image_random_flip(img, seed)`
//! draw from the row's pixels and `seed`. Inside a training feed, the same
//! SQL runs every epoch, so a constant seed alone would freeze the
//! "random" augmentation for the whole training. The feed therefore sets
//! [`AugmentOptions`] (its own seed and the epoch) in the configuration each
//! epoch's plan is built with, and every seeded function draws from
//! [`epoch_seed`]`(seed, config)`:
//!
//! ```text
//!  draw = xxh3(pixels, mix(seed, feed seed, epoch))   inside a feed
//!  draw = xxh3(pixels, seed)                          outside (a plain query)
//! ```
//! So the same (seed, feed seed, epoch) gives the same pixels, on any machine
//! and on resume; another epoch gives other crops and flips; and a query
//! outside a feed behaves exactly as before.

use datafusion::common::config::{ConfigExtension, ConfigOptions};
use datafusion::common::extensions_options;

extensions_options! {
    /// What a feed tells seeded functions about the epoch they run in.
    pub struct AugmentOptions {
        /// The feed's seed (its shuffle seed, or 0 without a shuffle).
        pub feed_seed: u64, default = 0
        /// The epoch the plan runs for; `None` outside a feed.
        pub epoch: Option<u64>, default = None
    }
}

impl AugmentOptions {
    /// The options of epoch `epoch` of a feed seeded with `feed_seed`.
    pub fn for_epoch(feed_seed: u64, epoch: u64) -> Self {
        Self {
            feed_seed,
            epoch: Some(epoch),
        }
    }
}

impl ConfigExtension for AugmentOptions {
    const PREFIX: &'static str = sqlfeed_plugin::AUGMENT_PREFIX;
}

/// The seed a seeded function draws with: `seed` itself outside a feed,
/// else `seed` mixed with the feed's seed and the epoch
/// ([`sqlfeed_plugin::mix_epoch_seed`], what plugins draw with too).
pub fn epoch_seed(seed: u64, config: &ConfigOptions) -> u64 {
    match config.extensions.get::<AugmentOptions>() {
        Some(options) => {
            sqlfeed_plugin::mix_epoch_seed(seed, options.feed_seed, options.epoch)
        }
        None => seed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(feed_seed: u64, epoch: Option<u64>) -> ConfigOptions {
        let mut config = ConfigOptions::new();
        config
            .extensions
            .insert(AugmentOptions { feed_seed, epoch });
        config
    }

    #[test]
    fn the_seed_changes_with_the_epoch_and_only_inside_a_feed() {
        let plain = ConfigOptions::new();
        assert_eq!(epoch_seed(7, &plain), 7);
        assert_eq!(epoch_seed(7, &config(42, None)), 7);
        let e0 = epoch_seed(7, &config(42, Some(0)));
        let e1 = epoch_seed(7, &config(42, Some(1)));
        assert_ne!(e0, e1);
        assert_eq!(e0, epoch_seed(7, &config(42, Some(0))), "reproducible");
        assert_ne!(
            e0,
            epoch_seed(7, &config(43, Some(0))),
            "the feed seed counts"
        );
        assert_ne!(
            e0,
            epoch_seed(8, &config(42, Some(0))),
            "the SQL seed counts"
        );
    }
}
