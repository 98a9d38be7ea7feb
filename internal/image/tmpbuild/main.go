package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/ramify-dev/ramify/internal/image"
)

func main() {
	if len(os.Args) > 1 {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		start := time.Now()
		_, err := image.Build(ctx, image.Options{Dir: os.Args[1]})
		fmt.Println("cancelled build:", err, time.Since(start))
		return
	}
	start := time.Now()
	img, err := image.Build(context.Background(), image.Options{Dir: "/var/cache/ramify/images", Progress: os.Stdout})
	fmt.Println(img, err, time.Since(start))
}
