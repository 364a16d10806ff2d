module devplug.test/gojson

go 1.21
