//! RESP's decimal integers: an optional minus and ASCII digits, of any length
//! (a header may announce a 40-digit bulk string; it is refused, and the
//! message names the number as Python's int() would print it).

/// A parsed header number: its value, saturated far beyond any limit, and
/// its canonical decimal text for messages.
pub struct Number {
    pub value: i128,
    pub text: String,
}

const SATURATED_DIGITS: usize = 30;

/// The number `text` holds, or None if it is not `-?[0-9]+`.
pub fn parse(text: &[u8]) -> Option<Number> {
    let (negative, digits) = match text.first() {
        Some(b'-') => (true, &text[1..]),
        _ => (false, text),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let first = digits.iter().position(|&d| d != b'0').unwrap_or(digits.len());
    let significant = &digits[first..];
    if significant.is_empty() {
        return Some(Number { value: 0, text: "0".to_string() });
    }
    let magnitude: i128 = if significant.len() > SATURATED_DIGITS {
        10i128.pow(SATURATED_DIGITS as u32)
    } else {
        significant.iter().fold(0i128, |acc, d| acc * 10 + i128::from(d - b'0'))
    };
    let mut canonical = String::with_capacity(significant.len() + 1);
    if negative {
        canonical.push('-');
    }
    canonical.push_str(std::str::from_utf8(significant).expect("ASCII digits"));
    Some(Number { value: if negative { -magnitude } else { magnitude }, text: canonical })
}
