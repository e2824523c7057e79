"""The Linux backend: an X11 display, the AT-SPI accessibility bus, input through xdotool (XTest)."""
