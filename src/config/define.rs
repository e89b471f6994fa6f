//! The machinery behind the settings table ([`super::defs`]): the
//! `settings_table!` macro that turns one line per setting into every layer
//! that holds it, and the merge rules a line names.
//!
//! Why a macro: a plain setting used to be spelled out in nine places (the
//! file's keys, the typed file, the flag, the overrides, the copy between
//! them, the flag check, the resolved field, its default, the merge). The
//! table says each once; this file writes the nine out.
//!
//! What one plain entry generates, for `name`:
//! - `FileKeys::name: Option<FILE>`, read by `read_with` (toml then places
//!   a bad value at its line), taken into `ConfigFile::name` (written back
//!   by `write_with` when given);
//! - `SettingFlags::name: FLAG`, the `speedtap run` flag (the doc is its
//!   `--help` text, the bracket its clap attributes), copied into
//!   `CliOverrides::name`, and checked there by `check` (a bad flag is
//!   named `--name` in kebab case);
//! - `Settings::name: VALUE`, `DEFAULT` in `Settings::default`, and the
//!   `merge` rule (one of the functions below) deciding it from the flag,
//!   the file and the default.
//!
//! A `group` of settings becomes one struct (each field an `Option`, unset
//! meaning the default of the part that uses them) held as one field by
//! the file, the flags and the resolved settings, while its keys and flags
//! stay top-level; the flag wins over the file field by field.
//!
//! A `file_only` setting (the tray's switches) has a key and no flag: the
//! file's value, else the default. A `flag_only` one (`--json`) has a flag
//! and no key: the flag's value, else the default.
//!
//! The table is cut into sections so that the keys a config file is
//! written with, and the flags `--help` lists, keep their order: each
//! section is its entries (`setting`, then any `group`, `file_only` and
//! `flag_only` blocks), then the file's and the flags' fields
//! that are resolved by hand (their rules live in [`super::resolve()`] and
//! [`super::file`]).

use super::values::Millis;
use super::ConfigError;

/// The flag's value, else the file's, else the default (a count, a name).
pub fn first_set<T>(flag: Option<T>, file: Option<T>, default: T) -> T {
    flag.or(file).unwrap_or(default)
}

/// Like [`first_set`], for a setting that may stay unset (`None`: off).
pub fn first_set_or_none<T>(flag: Option<T>, file: Option<T>, default: Option<T>) -> Option<T> {
    flag.or(file).or(default)
}

/// A number of milliseconds as written (flag, else file), held as a
/// duration; else the default.
pub fn first_set_ms(flag: Option<u64>, file: Option<u64>, default: Millis) -> Millis {
    flag.or(file).map_or(default, Millis::from_ms)
}

/// A switch the flag can only turn on: on if the flag or the file says so
/// (the file's `false` beats the default).
pub fn either_on(flag: bool, file: Option<bool>, default: bool) -> bool {
    flag || file.unwrap_or(default)
}

/// A repeatable flag: given at all, it replaces the file's list (not
/// added to it); else the file's, else the default.
pub fn flags_replace<T>(flag: Vec<T>, file: Option<Vec<T>>, default: Vec<T>) -> Vec<T> {
    if flag.is_empty() {
        file.unwrap_or(default)
    } else {
        flag
    }
}

/// Checks a flag that was given by the file's rule, naming the flag
/// (`slow_ttft_ms` is `--slow-ttft-ms`, as clap spells it) in the error.
pub fn check_flag<T, U, E: std::fmt::Display>(
    value: &Option<T>,
    name: &str,
    check: impl FnOnce(&T) -> Result<U, E>,
) -> Result<(), ConfigError> {
    match value {
        Some(v) => check(v).map(drop).map_err(|e| ConfigError::Flag {
            flag: format!("--{}", name.replace('_', "-")),
            message: e.to_string(),
        }),
        None => Ok(()),
    }
}

/// Generates the settings' layers from the table in [`super::defs`]; see
/// this module's doc for what each entry becomes.
macro_rules! settings_table {
    (
        $(
            section {
                $(
                    $(#[doc = $doc:tt])*
                    setting $name:ident {
                        file: $fty:ty $(, read_with = $read:literal)? $(, write_with = $write:literal)?;
                        flag: [$($clap:tt)*] $flagty:ty $(, check = $check:expr)?;
                        value: $vty:ty = $default:expr, merge = $merge:path;
                    }
                )*
                $(
                    group $group:ident: $group_ty:ident {
                        $(
                            $(#[doc = $gdoc:tt])*
                            setting $gname:ident {
                                file: $gty:ty $(, read_with = $gread:literal)? $(, write_with = $gwrite:literal)?;
                                flag: [$($gclap:tt)*] $(, check = $gcheck:expr)?;
                            }
                        )*
                    }
                )?
                $(
                    file_only {
                        $(
                            $(#[doc = $odoc:tt])*
                            $oname:ident: $oty:ty = $odefault:expr;
                        )*
                    }
                )?
                $(
                    flag_only {
                        $(
                            $(#[doc = $ldoc:tt])*
                            $lname:ident: [$($lclap:tt)*] $lty:ty = $ldefault:expr;
                        )*
                    }
                )?
                by_hand file { $($hand_file:tt)* }
                by_hand flags { $($hand_flags:tt)* }
            }
        )*
        by_hand file_keys { $($hand_keys:tt)* }
        by_hand overrides { $($hand_overrides:tt)* }
        by_hand settings {
            $( $(#[$smeta:meta])* $sname:ident: $sty:ty = $sdefault:expr, )*
        }
    ) => {
        /// The config file's contents, typed and validated. Every field is
        /// optional: absent means "not set here", so a lower layer (the
        /// defaults) applies.
        ///
        /// Build one with `ConfigFile::default()` and set fields;
        /// [`super::parse_config`] also remembers the file name and lines,
        /// so [`super::resolve()`] can name them. Equality compares the
        /// settings only, not where they came from. Serialised as the file
        /// is written: `None` keys are left out (toml skips them), the
        /// proxy limits are top-level keys, routes are `[[route]]`.
        #[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
        pub struct ConfigFile {
            $(
                $(
                    $(#[doc = $doc])*
                    $(#[serde(serialize_with = $write)])?
                    pub $name: Option<$fty>,
                )*
                $(
                    #[doc = concat!("The ", stringify!($group), " settings, written as top-level keys.")]
                    #[serde(flatten)]
                    pub $group: $group_ty,
                )?
                $($(
                    $(#[doc = $odoc])*
                    pub $oname: Option<$oty>,
                )*)?
                $($hand_file)*
            )*
        }

        $($(
            /// Settings kept together (each `None`: the default of the part
            /// that uses them, documented there), as one field of the file,
            /// the flags and the resolved settings; their keys and flags are
            /// top-level.
            #[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
            pub struct $group_ty {
                $(
                    $(#[doc = $gdoc])*
                    $(#[serde(serialize_with = $gwrite)])?
                    pub $gname: Option<$gty>,
                )*
            }

            impl $group_ty {
                /// Each field the other sets wins (flags over the file).
                pub(super) fn or(self, lower: $group_ty) -> $group_ty {
                    $group_ty {
                        $( $gname: self.$gname.or(lower.$gname), )*
                    }
                }
            }
        )?)*

        /// The file as serde reads it: the TOML's own shape (flat keys,
        /// `route` a list of tables), each value checked by its rule in
        /// [`super::values`] as it is read. Callers get [`ConfigFile`].
        #[derive(Default, serde::Deserialize)]
        #[serde(deny_unknown_fields, default)]
        pub(super) struct FileKeys {
            $($(
                $(#[serde(deserialize_with = $read)])?
                pub(super) $name: Option<$fty>,
            )*
            $($(
                $(#[serde(deserialize_with = $gread)])?
                pub(super) $gname: Option<$gty>,
            )*)?
            $($( pub(super) $oname: Option<$oty>, )*)?
            )*
            $($hand_keys)*
        }

        impl FileKeys {
            /// The typed file's keys from the table, taken from what was read; the
            /// others are left for [`super::file`] to fill.
            pub(super) fn take_table_keys(&mut self) -> ConfigFile {
                ConfigFile {
                    $(
                        $( $name: self.$name.take(), )*
                        $( $group: $group_ty { $( $gname: self.$gname.take(), )* }, )?
                        $($( $oname: self.$oname.take(), )*)?
                    )*
                    ..ConfigFile::default()
                }
            }
        }

        /// The flags that set a setting, as clap parses them; `speedtap
        /// run` and the tray app flatten them into their own arguments.
        #[derive(Debug, Clone, clap::Args)]
        pub struct SettingFlags {
            $(
                $(
                    $(#[doc = $doc])*
                    #[arg($($clap)*)]
                    pub $name: $flagty,
                )*
                $($(
                    $(#[doc = $gdoc])*
                    #[arg($($gclap)*)]
                    pub $gname: Option<$gty>,
                )*)?
                $($(
                    $(#[doc = $ldoc])*
                    #[arg($($lclap)*)]
                    pub $lname: $lty,
                )*)?
                $($hand_flags)*
            )*
        }

        impl SettingFlags {
            /// The table's flags over `by_hand`, the overrides whose flags
            /// are resolved by hand.
            pub fn overrides(&self, by_hand: CliOverrides) -> CliOverrides {
                CliOverrides {
                    $(
                        $( $name: self.$name.clone(), )*
                        $( $group: $group_ty { $( $gname: self.$gname.clone(), )* }, )?
                        $($( $lname: self.$lname.clone(), )*)?
                    )*
                    ..by_hand
                }
            }
        }

        /// What the command line says; `None`/`false`/empty means "not
        /// given". The values are as typed; [`super::resolve()`] checks
        /// them by the file's rules.
        #[derive(Clone, Debug, Default, PartialEq)]
        pub struct CliOverrides {
            $($(
                $(#[doc = $doc])*
                pub $name: $flagty,
            )*
            $(
                #[doc = concat!("The ", stringify!($group), " flags.")]
                pub $group: $group_ty,
            )?
            $($(
                $(#[doc = $ldoc])*
                pub $lname: $lty,
            )*)?
            )*
            $($hand_overrides)*
        }

        /// The table's flags' own checks, by the file's rules.
        pub(super) fn check_table_flags(flags: &CliOverrides) -> Result<(), ConfigError> {
            $(
                $($(
                    $crate::config::define::check_flag(&flags.$name, stringify!($name), $check)?;
                )?)*
                $($($(
                    $crate::config::define::check_flag(
                        &flags.$group.$gname,
                        stringify!($gname),
                        $gcheck,
                    )?;
                )?)*)?
            )*
            Ok(())
        }

        /// The resolved settings the engine runs with: every value decided
        /// (flag, else file, else default) and checked.
        #[derive(Clone, Debug, PartialEq)]
        pub struct Settings {
            $($(
                $(#[doc = $doc])*
                pub $name: $vty,
            )*
            $(
                #[doc = concat!("The ", stringify!($group), " settings.")]
                pub $group: $group_ty,
            )?
            $($(
                $(#[doc = $odoc])*
                pub $oname: $oty,
            )*)?
            $($(
                $(#[doc = $ldoc])*
                pub $lname: $lty,
            )*)?
            )*
            $( $(#[$smeta])* pub $sname: $sty, )*
        }

        impl Default for Settings {
            fn default() -> Self {
                Settings {
                    $(
                        $( $name: $default, )*
                        $( $group: $group_ty::default(), )?
                        $($( $oname: $odefault, )*)?
                        $($( $lname: $ldefault, )*)?
                    )*
                    $( $sname: $sdefault, )*
                }
            }
        }

        /// The table's settings decided by their merge rules; the others at
        /// their defaults, for [`super::resolve()`] to decide.
        pub(super) fn merge_table(file: &ConfigFile, flags: &CliOverrides) -> Settings {
            Settings {
                $(
                    $( $name: $merge(flags.$name.clone(), file.$name.clone(), $default), )*
                    $( $group: flags.$group.clone().or(file.$group.clone()), )?
                    $($( $oname: file.$oname.unwrap_or($odefault), )*)?
                    $($( $lname: flags.$lname.clone(), )*)?
                )*
                ..Settings::default()
            }
        }
    };
}

pub(super) use settings_table;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_beats_the_file_which_beats_the_default() {
        assert_eq!(first_set(Some(1), Some(2), 3), 1);
        assert_eq!(first_set(None, Some(2), 3), 2);
        assert_eq!(first_set(None, None, 3), 3);
        assert_eq!(first_set_or_none(None, None::<u8>, None), None);
        assert_eq!(first_set_ms(None, Some(7), Millis::from_ms(9)), 7);
        assert_eq!(flags_replace(vec![1], Some(vec![2, 3]), vec![]), [1]);
        assert_eq!(flags_replace(vec![], Some(vec![2, 3]), vec![]), [2, 3]);
    }

    #[test]
    fn a_switch_flag_only_turns_on_and_the_files_false_beats_the_default() {
        assert!(either_on(true, Some(false), false));
        assert!(!either_on(false, Some(false), true));
        assert!(either_on(false, None, true));
    }

    #[test]
    fn a_bad_flag_is_named_in_kebab_case() {
        let e = check_flag(&Some(0u64), "max_db_mb", |n: &u64| {
            super::super::values::at_least_one(*n)
        })
        .unwrap_err();
        assert_eq!(e.to_string(), "--max-db-mb: must be at least 1");
        assert!(check_flag(&None::<u64>, "max_db_mb", |_: &u64| Err::<(), _>("x")).is_ok());
    }
}
