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

use std::any::Any;

use datafusion::common::config::{
    ConfigEntry, ConfigExtension, ConfigOptions, ExtensionOptions,
};
use datafusion::common::config_err;
use datafusion::error::Result;

/// What a feed tells seeded functions about the epoch they run in:
/// `sqlfeed_augment.feed_seed` and `sqlfeed_augment.epoch`.
///
/// Written out rather than by `extensions_options!`, whose entries leave
/// out the prefix: these list theirs under their full names (as Ballista's
/// own options do), so that a cluster job's tasks, whose settings travel
/// as the entries' key-value pairs, get them on every executor.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AugmentOptions {
    /// The feed's seed (its shuffle seed, or 0 without a shuffle).
    pub feed_seed: u64,
    /// The epoch the plan runs for; `None` outside a feed.
    pub epoch: Option<u64>,
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

impl ExtensionOptions for AugmentOptions {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn cloned(&self) -> Box<dyn ExtensionOptions> {
        Box::new(self.clone())
    }

    fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let number = || {
            value.trim().parse::<u64>().or_else(|_| {
                config_err!(
                    "{}.{key} takes a whole number from 0 to {}, got '{value}'",
                    Self::PREFIX,
                    u64::MAX
                )
            })
        };
        match key {
            "feed_seed" => self.feed_seed = number()?,
            "epoch" => self.epoch = Some(number()?),
            _ => {
                return config_err!(
                    "configuration key `{}.{key}` does not exist; {} has feed_seed and epoch",
                    Self::PREFIX,
                    Self::PREFIX
                );
            }
        }
        Ok(())
    }

    fn entries(&self) -> Vec<ConfigEntry> {
        vec![
            ConfigEntry {
                key: format!("{}.feed_seed", Self::PREFIX),
                value: Some(self.feed_seed.to_string()),
                description: "The feed's seed (its shuffle seed, or 0 without a shuffle)",
            },
            ConfigEntry {
                key: format!("{}.epoch", Self::PREFIX),
                value: self.epoch.map(|epoch| epoch.to_string()),
                description: "The epoch the plan runs for; none outside a feed",
            },
        ]
    }
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
    fn the_options_are_listed_and_set_under_their_full_names() -> Result<()> {
        let mut config = ConfigOptions::new();
        config.extensions.insert(AugmentOptions::default());
        let listed = |config: &ConfigOptions| -> Vec<(String, Option<String>)> {
            config
                .entries()
                .into_iter()
                .filter(|e| e.key.starts_with("sqlfeed_augment."))
                .map(|e| (e.key, e.value))
                .collect()
        };
        assert_eq!(
            listed(&config),
            vec![
                (
                    "sqlfeed_augment.feed_seed".to_string(),
                    Some("0".to_string())
                ),
                ("sqlfeed_augment.epoch".to_string(), None),
            ]
        );
        // What a cluster task does with the pairs it is sent.
        let mut sent = ConfigOptions::new();
        sent.extensions
            .insert(AugmentOptions::for_epoch(u64::MAX, 3));
        for (key, value) in listed(&sent) {
            if let Some(value) = value {
                config.set(&key, &value)?;
            }
        }
        assert_eq!(
            config.extensions.get::<AugmentOptions>(),
            Some(&AugmentOptions::for_epoch(u64::MAX, 3))
        );
        let err = config
            .set("sqlfeed_augment.epoch", "-1")
            .expect_err("not a u64")
            .to_string();
        assert!(
            err.contains("sqlfeed_augment.epoch") && err.contains("'-1'"),
            "{err}"
        );
        let err = config
            .set("sqlfeed_augment.epochs", "1")
            .expect_err("no such key")
            .to_string();
        assert!(err.contains("feed_seed and epoch"), "{err}");
        Ok(())
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
