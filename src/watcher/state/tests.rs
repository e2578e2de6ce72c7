use super::*;

#[test]
fn retry_delays_read_as_people_write_them() {
    assert_eq!(format_delay(Duration::from_millis(200)), "200ms");
}
