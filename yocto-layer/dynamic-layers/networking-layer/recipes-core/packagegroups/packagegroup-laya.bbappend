# meta-networking is in the build: bring its mosquitto as the local broker that the example
# configuration (mqtt://localhost:1883) talks to. A recommendation, so an image can leave it
# out (BAD_RECOMMENDATIONS) when the broker is elsewhere.
RRECOMMENDS:${PN} += "mosquitto"
