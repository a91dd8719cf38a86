module keyload.bench/httpclient

go 1.21
