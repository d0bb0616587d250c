//! Enums whose values are wire codes, written once: the enum
//! (`#[repr(u8)]`, each value's number its code), `code`, `from_code` and,
//! where the values have words (the CLI's, JSON's and specs'), `name`.
//! The codes are on the wire: never reuse one.

/// `wire_codes! { /// doc  #[derive(..)] pub enum Name { /// doc  A = 1 => "a", ... } }`;
/// the words are optional (all or none).
macro_rules! wire_codes {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $code:literal $(=> $word:literal)? ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[repr(u8)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant = $code, )+
        }

        impl $name {
            /// The wire code.
            #[inline]
            pub const fn code(self) -> u8 {
                self as u8
            }

            /// Looks a wire code up; `None` for a code this version does not
            /// know.
            #[inline]
            pub const fn from_code(code: u8) -> Option<$name> {
                match code {
                    $( $code => Some($name::$variant), )+
                    _ => None,
                }
            }
        }

        $crate::codes::wire_codes!(@names $name $( $variant $($word)? ),+);
    };
    (@names $name:ident $( $variant:ident $word:literal ),+) => {
        impl $name {
            /// Its word (the CLI's, JSON's and specs').
            #[inline]
            pub const fn name(self) -> &'static str {
                match self {
                    $( $name::$variant => $word, )+
                }
            }
        }
    };
    (@names $name:ident $( $variant:ident ),+) => {};
}

pub(crate) use wire_codes;

#[cfg(test)]
mod tests {
    wire_codes! {
        /// Two values with words.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        enum Worded {
            /// One.
            One = 1 => "one",
            Three = 3 => "three",
        }
    }

    wire_codes! {
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        enum Bare {
            Zero = 0,
            Two = 2,
        }
    }

    #[test]
    fn codes_round_trip_and_unknown_codes_are_none() {
        for w in [Worded::One, Worded::Three] {
            assert_eq!(Worded::from_code(w.code()), Some(w));
        }
        assert_eq!(Worded::Three.code(), 3);
        assert_eq!(Worded::from_code(2), None);
        assert_eq!(Worded::One.name(), "one");
        assert_eq!(Bare::from_code(2), Some(Bare::Two));
        assert_eq!(Bare::from_code(1), None);
        assert_eq!(Bare::Zero.code(), 0);
    }
}
